// Builds the dashboard into dist/ (embedded into the shoal binary by build.rs) and runs the unit tests.
// `npm run dev` proxies the API to a local node (SHOAL_API, default http://127.0.0.1:52520).
import { defineConfig } from 'vitest/config';
import { svelte } from '@sveltejs/vite-plugin-svelte';

const api = process.env['SHOAL_API'] ?? 'http://127.0.0.1:52520';

export default defineConfig({
  plugins: [svelte()],
  build: { outDir: 'dist', emptyOutDir: true, sourcemap: false, chunkSizeWarningLimit: 600 },
  server: { proxy: { '/api': api, '/v1': api } },
  preview: { proxy: { '/api': api, '/v1': api } },
  resolve: process.env['VITEST'] ? { conditions: ['browser'] } : undefined,
  test: {
    environment: 'happy-dom',
    include: ['tests/**/*.test.ts'],
    setupFiles: ['tests/setup.ts'],
  },
});
