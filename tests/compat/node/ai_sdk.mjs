// The Vercel AI SDK (`ai` + `@ai-sdk/openai-compatible`) against streamproxy.
// stdin: {"base": ".../v1", "model": "...", "max_tokens": 6, "stop": [...]?, "cases": [...]}
// stdout: one JSON line {"node": version, "results": {...}, "wire": [...]}
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, jsonSchema, streamText, tool } from "ai";
import { finish, readConfig, recordingFetch, runCases } from "./record.mjs";

const config = await readConfig();
const wire = [];
const provider = createOpenAICompatible({ name: "streamproxy", baseURL: config.base, apiKey: "unused", includeUsage: true, fetch: recordingFetch(wire) });
const model = provider.chatModel(config.model);
const base = {
  model, prompt: config.prompt ?? "Say hello in five words.", maxOutputTokens: config.max_tokens, temperature: 0, maxRetries: 0,
  ...(config.stop ? { stopSequences: config.stop } : {}),
};
const weather = {
  get_weather: tool({
    description: "Current weather in a city",
    inputSchema: jsonSchema({
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city"],
    }),
  }),
};

const describe = (e) => (e instanceof Error ? `${e.name}: ${e.message}` : typeof e === "object" ? JSON.stringify(e) : String(e));

async function drain(result) {
  const parts = [];
  for await (const part of result.fullStream) parts.push(part);
  return parts;
}

const cases = {
  async generateText() {
    const r = await generateText(base);
    return { text: r.text, finishReason: r.finishReason, rawFinishReason: r.rawFinishReason, usage: r.usage };
  },
  async streamText() {
    const errors = [];
    const r = streamText({ ...base, onError: ({ error }) => errors.push(describe(error)) });
    const parts = await drain(r);
    return {
      deltas: parts.filter((p) => p.type === "text-delta").map((p) => p.text),
      types: [...new Set(parts.map((p) => p.type))],
      errors: [...errors, ...parts.filter((p) => p.type === "error").map((p) => describe(p.error))],
      text: await r.text, finishReason: await r.finishReason, usage: await r.usage,
    };
  },
  async generateText_tools() {
    const r = await generateText({ ...base, tools: weather });
    return { text: r.text, finishReason: r.finishReason, toolCalls: r.toolCalls.map((c) => ({ toolCallId: c.toolCallId, toolName: c.toolName, input: c.input })) };
  },
  async streamText_tools() {
    const errors = [];
    const r = streamText({ ...base, tools: weather, onError: ({ error }) => errors.push(describe(error)) });
    const parts = await drain(r);
    return {
      types: [...new Set(parts.map((p) => p.type))],
      errors: [...errors, ...parts.filter((p) => p.type === "error").map((p) => describe(p.error))],
      toolCalls: (await r.toolCalls).map((c) => ({ toolCallId: c.toolCallId, toolName: c.toolName, input: c.input })),
      finishReason: await r.finishReason,
    };
  },
};

const results = await runCases(cases, config.cases ?? ["generateText", "streamText"]);
console.log(JSON.stringify({ node: process.version, results, wire: await finish(wire) }));
