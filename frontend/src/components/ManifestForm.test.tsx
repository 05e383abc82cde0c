import { fireEvent, render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { ApiError } from '../api/client';
import { ManifestForm, locPath, manifestErrors } from './ManifestForm';

test('the loc path reads as a field name', () => {
  expect(locPath(['workflow', 'specification', 'tasks', 0, 'id'])).toBe('workflow.specification.tasks[0].id');
});

test("the server's 422 is shown inline, each error naming its field", () => {
  const err = new ApiError(422, [
    { loc: ['body', 'workflow', 'specification', 'tasks', 0, 'id'], msg: 'field required', type: 'value_error' },
    { loc: ['query', 'slack'], msg: 'Input should be less than or equal to 100', type: 'less_than_equal' },
  ]);
  render(<ManifestForm submitting={false} serverError={err} onSubmit={() => {}} />);
  const text = screen.getByLabelText(/^Manifest \(JSON/);
  expect(text).toHaveAttribute('aria-invalid', 'true');
  expect(text).toHaveAccessibleDescription('workflow.specification.tasks[0].id: field required');
  expect(screen.getByLabelText(/Load slack/)).toHaveAccessibleDescription('slack: Input should be less than or equal to 100');
  expect(screen.getByLabelText(/^Nodes/)).toHaveAttribute('aria-invalid', 'false');
});

test('text that is not JSON is refused in the browser, naming the document', async () => {
  const onSubmit = vi.fn();
  render(<ManifestForm submitting={false} serverError={null} onSubmit={onSubmit} />);
  const text = screen.getByLabelText(/^Manifest \(JSON/);
  fireEvent.change(text, { target: { value: '{"jobs": [' } });
  await userEvent.click(screen.getByRole('button', { name: 'Place manifest' }));
  expect(onSubmit).not.toHaveBeenCalled();
  expect(text).toHaveAccessibleDescription(/^\(document\): not JSON/);
});

test('a pasted manifest is submitted parsed, with the options', async () => {
  const onSubmit = vi.fn();
  render(<ManifestForm submitting={false} serverError={null} onSubmit={onSubmit} />);
  fireEvent.change(screen.getByLabelText(/^Manifest \(JSON/), { target: { value: '{"name": "w", "jobs": []}' } });
  await userEvent.type(screen.getByLabelText(/^Nodes/), 'a,b');
  await userEvent.selectOptions(screen.getByLabelText('Solver'), 'greedy');
  await userEvent.click(screen.getByRole('button', { name: 'Place manifest' }));
  expect(onSubmit).toHaveBeenCalledWith({ document: { name: 'w', jobs: [] }, options: { nodes: 'a,b', solver: 'greedy', slack: 0.1 } });
});

test('an uploaded file fills the manifest', async () => {
  render(<ManifestForm submitting={false} serverError={null} onSubmit={() => {}} />);
  const file = new File(['{"name": "up"}'], 'up.json', { type: 'application/json' });
  await userEvent.upload(screen.getByLabelText('Manifest file'), file);
  expect(await screen.findByText('Loaded up.json')).toBeInTheDocument();
  expect(screen.getByLabelText(/^Manifest \(JSON/)).toHaveValue('{"name": "up"}');
});

test('errors that are not 422 go to the form', () => {
  expect(manifestErrors(new ApiError(403, 'no')).form).toEqual(['This token may not see this (403).']);
});
