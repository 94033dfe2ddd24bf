// Unmounts components between tests and gives each test a fresh localStorage.
import { afterEach } from 'vitest';
import { cleanup } from '@testing-library/svelte';

afterEach(() => {
  cleanup();
  localStorage.clear();
});
