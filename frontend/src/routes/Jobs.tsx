export function Jobs() {
  return (
    <section aria-labelledby="jobs-title">
      <h1 id="jobs-title">Jobs</h1>
      <div className="state state-empty">
        Manifests and job placement (2-Layer Scheduling) arrive with the control plane's manifests API. This view will let you upload a
        manifest, see the placement of each job on a node and the bytes it saves.
      </div>
    </section>
  );
}
