/**
 * What the Connect view shows: for each API a client can speak (OpenAI, Anthropic, Ollama), the base URL
 * to give the client and snippets that run as shown — with this node's address, a model the cluster
 * serves, and the API token read from the environment when the node needs one.
 */

export interface ConnectOptions {
  /** Where this node's API is reached, as the browser reached it (`http://127.0.0.1:52520`). */
  origin: string;
  /** A model the cluster serves, or null when none runs yet. */
  model: string | null;
  /** The node asks for its API token on every request that generates. */
  tokenRequired: boolean;
}

export interface Snippet {
  id: string;
  label: string;
  code: string;
}

export interface ApiSection {
  id: 'openai' | 'anthropic' | 'ollama';
  title: string;
  /** The base URL (or host) to give the client. */
  baseUrl: string;
  note: string;
  snippets: Snippet[];
}

/** The environment variable the snippets read the token from. */
export const TOKEN_VARIABLE = 'SHOAL_API_TOKEN';

/** Placeholder shown when no model runs yet. */
export const MODEL_PLACEHOLDER = 'MODEL';

/** A Python string literal. */
function py(text: string): string {
  return JSON.stringify(text);
}

export function connectSections({ origin, model, tokenRequired }: ConnectOptions): ApiSection[] {
  const name = model ?? MODEL_PLACEHOLDER;
  const key = tokenRequired ? `os.environ[${py(TOKEN_VARIABLE)}]` : py('unused');
  const imports = tokenRequired ? 'import os\n' : '';
  const question = 'Name three colours.';
  const curlAuth = tokenRequired ? ` \\\n  -H "Authorization: Bearer $${TOKEN_VARIABLE}"` : '';
  const openaiBody = JSON.stringify({ model: name, messages: [{ role: 'user', content: question }], max_tokens: 32 });
  const bearer = tokenRequired ? `, headers={"Authorization": "Bearer " + os.environ[${py(TOKEN_VARIABLE)}]}` : '';
  return [
    {
      id: 'openai',
      title: 'OpenAI',
      baseUrl: `${origin}/v1`,
      note: 'Chat and completions, streamed or whole, with tools and JSON output (response_format).',
      snippets: [
        {
          id: 'openai-python',
          label: 'Python (pip install openai)',
          code:
            `${imports}from openai import OpenAI\n\n` +
            `client = OpenAI(base_url=${py(`${origin}/v1`)}, api_key=${key})\n` +
            `reply = client.chat.completions.create(\n` +
            `    model=${py(name)},\n` +
            `    messages=[{"role": "user", "content": ${py(question)}}],\n` +
            `    max_tokens=32,\n)\n` +
            `print(reply.choices[0].message.content)\n`,
        },
        {
          id: 'openai-curl',
          label: 'curl',
          code: `curl ${origin}/v1/chat/completions${curlAuth} \\\n  -H "Content-Type: application/json" \\\n  -d '${openaiBody}'\n`,
        },
      ],
    },
    {
      id: 'anthropic',
      title: 'Anthropic',
      baseUrl: origin,
      note: 'The Messages API (POST /v1/messages), streamed or whole, with tools. Claude Code and other agents take the base URL from ANTHROPIC_BASE_URL.',
      snippets: [
        {
          id: 'anthropic-python',
          label: 'Python (pip install anthropic)',
          code:
            `${imports}from anthropic import Anthropic\n\n` +
            `client = Anthropic(base_url=${py(origin)}, api_key=${key})\n` +
            `reply = client.messages.create(\n` +
            `    model=${py(name)},\n` +
            `    max_tokens=32,\n` +
            `    messages=[{"role": "user", "content": ${py(question)}}],\n)\n` +
            `print(reply.content[0].text)\n`,
        },
        {
          id: 'anthropic-env',
          label: 'Agents (environment)',
          code:
            `export ANTHROPIC_BASE_URL=${origin}\n` +
            (tokenRequired ? `export ANTHROPIC_API_KEY=$${TOKEN_VARIABLE}\n` : 'export ANTHROPIC_API_KEY=unused\n') +
            `export ANTHROPIC_MODEL=${name}\n`,
        },
      ],
    },
    {
      id: 'ollama',
      title: 'Ollama',
      baseUrl: `${origin}/ollama`,
      note: 'Chat, generate, tags, show, ps and version; Open WebUI, Continue and Zed take this as the Ollama host. `shoal node --ollama-port 11434` also serves it on Ollama’s usual port.',
      snippets: [
        {
          id: 'ollama-python',
          label: 'Python (pip install ollama)',
          code:
            `${imports}from ollama import Client\n\n` +
            `client = Client(host=${py(`${origin}/ollama`)}${bearer})\n` +
            `reply = client.chat(\n` +
            `    model=${py(name)},\n` +
            `    messages=[{"role": "user", "content": ${py(question)}}],\n` +
            `    options={"num_predict": 32},\n)\n` +
            `print(reply.message.content)\n`,
        },
      ],
    },
  ];
}
