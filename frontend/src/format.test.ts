import { bytesAxis, bytesUnit, formatBytes } from './format';

test('the bytes axis unit follows the largest value', () => {
  expect(bytesUnit(0).unit).toBe('B');
  expect(bytesUnit(1023).unit).toBe('B');
  expect(bytesUnit(3 * 1024).unit).toBe('KiB');
  expect(bytesUnit(5 * 1024 ** 2).unit).toBe('MiB');
  expect(bytesUnit(2 * 1024 ** 3).unit).toBe('GiB');
});

test('KiB values on a bytes axis do not all read 0.0', () => {
  // the 101-job Seismology view: a few KiB moved
  const ax = bytesAxis([2048, 6144, 0]);
  expect(ax.unit).toBe('KiB');
  const ticks = [0, 1536, 3072, 4608, 6144].map(ax.tick);
  expect(ticks).toEqual(['0', '1.5', '3', '4.5', '6']);
  expect(new Set(ticks).size).toBe(5);
});

test('large values get fewer decimals; raw bytes are whole numbers', () => {
  expect(bytesAxis([300 * 1024 ** 3]).tick(150 * 1024 ** 3)).toBe('150');
  expect(bytesAxis([40 * 1024 ** 2]).tick(12.345 * 1024 ** 2)).toBe('12.3');
  expect(bytesAxis([500]).tick(250)).toBe('250');
  expect(bytesAxis([]).unit).toBe('B');
  expect(formatBytes(1536)).toBe('1.50 KiB');
});
