import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { ApiError } from '../api/client';
import { PolicyForm, validatePolicy } from './PolicyForm';

const policy = { node_id: 'a', policy: 'lru', high_watermark: 0.9, low_watermark: 0.7, version: 2, applied_version: 2, updated_at: 1763900000 };

test('client-side validation names the field and does not submit', async () => {
  const onSubmit = vi.fn();
  render(<PolicyForm nodeId="a" policy={policy} readOnly={false} saving={false} serverError={null} onSubmit={onSubmit} />);
  const low = screen.getByLabelText(/Low watermark/);
  await userEvent.clear(low);
  await userEvent.type(low, '0.95');
  await userEvent.click(screen.getByRole('button', { name: 'Apply policy' }));
  expect(onSubmit).not.toHaveBeenCalled();
  expect(low).toHaveAccessibleDescription('Low watermark must be below the high watermark.');
});

test('a valid form submits numbers', async () => {
  const onSubmit = vi.fn();
  render(<PolicyForm nodeId="a" policy={policy} readOnly={false} saving={false} serverError={null} onSubmit={onSubmit} />);
  await userEvent.selectOptions(screen.getByLabelText('Eviction policy'), 'lfu');
  await userEvent.click(screen.getByRole('button', { name: 'Apply policy' }));
  expect(onSubmit).toHaveBeenCalledWith({ policy: 'lfu', high_watermark: 0.9, low_watermark: 0.7 });
});

test("the server's 422 is shown next to the field it names", () => {
  const err = new ApiError(422, [{ loc: ['body', 'high_watermark'], msg: 'must be at most 1', type: 'value_error' }]);
  render(<PolicyForm nodeId="a" policy={policy} readOnly={false} saving={false} serverError={err} onSubmit={() => {}} />);
  expect(screen.getByLabelText(/High watermark/)).toHaveAccessibleDescription('must be at most 1');
});

test('a read-only token gets no submit button', () => {
  render(<PolicyForm nodeId="a" policy={policy} readOnly saving={false} serverError={null} onSubmit={() => {}} />);
  expect(screen.queryByRole('button', { name: 'Apply policy' })).toBeNull();
});

test('validatePolicy bounds', () => {
  expect(validatePolicy({ policy: 'lru', high: '1.5', low: '0.5' }).high_watermark).toMatch(/\(0, 1\]/);
  expect(validatePolicy({ policy: 'lru', high: '0.9', low: 'x' }).low_watermark).toMatch(/\[0, 1\)/);
  expect(validatePolicy({ policy: 'lru', high: '0.9', low: '0.5' })).toEqual({});
});
