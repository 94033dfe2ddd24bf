/// <reference types="node" />
import { describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { connectSections, MODEL_PLACEHOLDER, TOKEN_VARIABLE } from '../src/lib/connect';

const origin = 'http://127.0.0.1:52520';

function snippet(id: string, tokenRequired: boolean, model: string | null = 'smol') {
  const found = connectSections({ origin, model, tokenRequired })
    .flatMap((s) => s.snippets)
    .find((s) => s.id === id);
  if (!found) throw new Error(`no snippet ${id}`);
  return found.code;
}

describe('the Connect view', () => {
  it('gives each API the base URL its clients take', () => {
    const urls = Object.fromEntries(connectSections({ origin, model: 'smol', tokenRequired: false }).map((s) => [s.id, s.baseUrl]));
    expect(urls).toEqual({ openai: `${origin}/v1`, anthropic: origin, ollama: `${origin}/ollama` });
  });

  it('reads the token from the environment only when the node asks for one', () => {
    for (const id of ['openai-python', 'anthropic-python', 'ollama-python', 'openai-curl']) {
      expect(snippet(id, true)).toContain(TOKEN_VARIABLE);
      expect(snippet(id, false)).not.toContain(TOKEN_VARIABLE);
    }
    expect(snippet('openai-curl', true)).toContain(`Authorization: Bearer $${TOKEN_VARIABLE}`);
    expect(snippet('anthropic-env', true)).toContain(`ANTHROPIC_API_KEY=$${TOKEN_VARIABLE}`);
  });

  it('names the model served, or a placeholder when none runs', () => {
    expect(snippet('openai-python', false, 'Qwen3 "30B"')).toContain('model="Qwen3 \\"30B\\""');
    expect(snippet('openai-python', false, null)).toContain(`model="${MODEL_PLACEHOLDER}"`);
    const body = snippet('openai-curl', false).split("-d '")[1]?.replace(/'\n$/, '') ?? '';
    expect(JSON.parse(body)).toMatchObject({ model: 'smol', max_tokens: 32 });
  });

  it('gives Python that parses, with and without a token', () => {
    for (const tokenRequired of [false, true]) {
      for (const id of ['openai-python', 'anthropic-python', 'ollama-python']) {
        const code = snippet(id, tokenRequired);
        // Python's own parser: a snippet with a syntax error would throw here.
        execFileSync('python3', ['-c', 'import ast, sys; ast.parse(sys.stdin.read())'], { input: code });
      }
    }
  });
});
