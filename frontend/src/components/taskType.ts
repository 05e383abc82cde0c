// A job's task type: the one the instance states (the API's `task`: WfFormat `category`, or
// the command's `program`), else read from its id — WfCommons and Pegasus ids are
// "<task type>_<number>" (mProject_00012, individuals_ID0000003); an id that is only a
// number ("ID05") is its own type.
export function taskType(id: string): string {
  const t = id.replace(/[_-]?(ID)?\d+$/i, '');
  return t === '' ? id : t;
}

export function jobTask(j: { id: string; task?: string | null }): string {
  return j.task ? j.task : taskType(j.id);
}
