// /jobs: the submitted manifests, and (admin) the form that submits one.
import { useNavigate } from 'react-router';
import { useManifests, useSubmitManifest } from '../api/hooks';
import { useAuth } from '../auth/auth';
import { ManifestForm } from '../components/ManifestForm';
import { ManifestList } from '../components/ManifestList';
import { EmptyState, ErrorState, LoadingState } from '../components/States';

export function Jobs() {
  const { canWrite } = useAuth();
  const manifests = useManifests();
  const submit = useSubmitManifest();
  const navigate = useNavigate();
  return (
    <section aria-labelledby="jobs-title">
      <h1 id="jobs-title">Jobs</h1>
      <p className="muted">
        Workflow manifests placed on the nodes (2-Layer Scheduling): each job on a node, and each node&apos;s plan of prefetches, pins and
        evictions.
      </p>
      {canWrite && (
        <ManifestForm
          submitting={submit.isPending}
          serverError={submit.error}
          onSubmit={(v) => submit.mutate(v, { onSuccess: (m) => void navigate(`/jobs/${m.id}`) })}
        />
      )}
      <h2>Manifests</h2>
      {manifests.isPending ? (
        <LoadingState label="Loading manifests" />
      ) : manifests.isError && !manifests.data ? (
        <ErrorState error={manifests.error} title="Could not load the manifests" />
      ) : manifests.data.items.length === 0 ? (
        <EmptyState>No manifest submitted yet.{canWrite ? ' Upload or paste one above.' : ''}</EmptyState>
      ) : (
        <>
          {manifests.isError && <ErrorState error={manifests.error} title="Showing the last known manifests" />}
          <ManifestList manifests={manifests.data.items} />
        </>
      )}
    </section>
  );
}
