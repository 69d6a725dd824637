// The `openai` npm package against streamproxy (tests/compat/test_node.py).
// stdin: {"base": ".../v1", "model": "...", "max_tokens": 6, "stop": [...]?, "cases": [...]}
// stdout: one JSON line {"node": version, "sdk": version, "results": {...}, "wire": [...]}
import OpenAI from "openai";
import { VERSION } from "openai/version";
import { finish, readConfig, recordingFetch, runCases } from "./record.mjs";

const config = await readConfig();
const wire = [];
const client = new OpenAI({ baseURL: config.base, apiKey: "unused", maxRetries: 0, timeout: 120000, fetch: recordingFetch(wire) });
const messages = [{ role: "user", content: config.prompt ?? "Say hello in five words." }];
const base = { model: config.model, messages, max_tokens: config.max_tokens, temperature: 0, ...(config.stop ? { stop: config.stop } : {}) };
const tools = config.tools ?? [];

const cases = {
  async chat() {
    const r = await client.chat.completions.create(base);
    return { content: r.choices[0].message.content, role: r.choices[0].message.role, finish_reason: r.choices[0].finish_reason, usage: r.usage, system_fingerprint: r.system_fingerprint };
  },
  async chat_raw() {
    // What the SDK returns, without indexing into it (a body without choices must not look like an answer).
    const r = await client.chat.completions.create(base);
    return { keys: Object.keys(r ?? {}), choices: r?.choices ?? null, body_error: r?.error ?? null };
  },
  async stream() {
    const stream = await client.chat.completions.create({ ...base, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    return { chunks };
  },
  async stream_helper() {
    const runner = client.chat.completions.stream(base);
    const deltas = [];
    runner.on("content", (delta) => deltas.push(delta));
    const final = await runner.finalChatCompletion();
    return { deltas, content: final.choices[0].message.content, finish_reason: final.choices[0].finish_reason };
  },
  async tools() {
    const r = await client.chat.completions.create({ ...base, tools });
    return { message: r.choices[0].message, finish_reason: r.choices[0].finish_reason };
  },
  async tools_stream() {
    const stream = await client.chat.completions.create({ ...base, tools, stream: true });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    return { chunks };
  },
  async tools_stream_helper() {
    const runner = client.chat.completions.stream({ ...base, tools });
    const done = [];
    runner.on("tool_calls.function.arguments.done", (e) => done.push({ name: e.name, arguments: e.arguments, parsed_arguments: e.parsed_arguments }));
    const final = await runner.finalChatCompletion();
    return { done, message: final.choices[0].message, finish_reason: final.choices[0].finish_reason };
  },
};

const results = await runCases(cases, config.cases ?? Object.keys(cases));
console.log(JSON.stringify({ node: process.version, sdk: VERSION, results, wire: await finish(wire) }));
