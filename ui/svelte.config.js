// Svelte compiler options shared by vite, vitest and svelte-check: runes everywhere.
export default {
  compilerOptions: { runes: true },
};
