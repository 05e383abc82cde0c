// A job's task type, read from its id: the manifest carries no task-type field, and WfCommons
// and Pegasus ids are "<task type>_<number>" (mProject_00012, individuals_ID0000003); an id
// that is only a number ("ID05") is its own type.
export function taskType(id: string): string {
  const t = id.replace(/[_-]?(ID)?\d+$/i, '');
  return t === '' ? id : t;
}
