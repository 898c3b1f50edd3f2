// A TypeScript agent trained by rLLM without a line of Python: a multi-turn, tool-using loop on
// the official `openai` package, served over the rLLM remote agent protocol
// (docs/remote-agents.md) with nothing but Node's standard library.
//
//   POST /rollouts {task, config: {base_url, api_key, model, ...}} -> 200 {artifacts: {replies}}
//   GET  /health                                                    -> 200 {status: "ok", active}
//
// Every model call goes to config.base_url, the trainer's gateway session, which records the
// exact token ids; the agent answers only what it produced and rLLM builds the rest.
// Usage: node dist/agent.js [--port P] [--host H]   (prints its URL once it listens)

import http from "node:http";
import OpenAI from "openai";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";

interface Task {
  id: string;
  instruction: string | unknown[];
  metadata?: { words?: string[] };
}

interface RolloutRequest {
  task: Task;
  config: { base_url: string; api_key: string; model: string };
}

const MAX_TOOL_ROUNDS = 3;

// One tool: the agent may look up the word it is asked for (index into the task's words).
const tools: ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "lookup_word",
      description: "The task's word at an index (0-based).",
      parameters: { type: "object", properties: { index: { type: "integer" } }, required: ["index"] },
    },
  },
];

function runTool(name: string, args: string, words: string[]): string {
  if (name !== "lookup_word") return `unknown tool ${name}`;
  try {
    const index = Number(JSON.parse(args).index);
    return words[index] ?? "no such word";
  } catch {
    return "arguments are not JSON";
  }
}

// The say game, turn by turn: ask for each word with the whole history kept; between turns the
// model may call tools, whose results go back into the conversation.
async function rollout(req: RolloutRequest): Promise<{ artifacts: { replies: string[]; tool_calls: number } }> {
  const client = new OpenAI({ baseURL: req.config.base_url, apiKey: req.config.api_key, maxRetries: 0 });
  const words = req.task.metadata?.words ?? [String(req.task.instruction)];
  const messages: ChatCompletionMessageParam[] = [];
  const replies: string[] = [];
  let toolCalls = 0;
  for (const word of words) {
    messages.push({ role: "user", content: `say: ${word}` });
    const answered = replies.length;
    for (let round = 0; round < MAX_TOOL_ROUNDS; round++) {
      const reply = await client.chat.completions.create({ model: req.config.model, messages, tools });
      const message = reply.choices[0].message;
      const calls = message.tool_calls ?? [];
      if (calls.length === 0) {
        messages.push({ role: "assistant", content: message.content ?? "" });
        replies.push(message.content ?? "");
        break;
      }
      messages.push({ role: "assistant", content: message.content, tool_calls: calls });
      for (const call of calls) {
        toolCalls++;
        const result = call.type === "function" ? runTool(call.function.name, call.function.arguments, words) : "unsupported";
        messages.push({ role: "tool", tool_call_id: call.id, content: result });
      }
    }
    if (replies.length === answered) replies.push(""); // only tool calls: no answer this turn
  }
  return { artifacts: { replies, tool_calls: toolCalls } };
}

function send(res: http.ServerResponse, status: number, body: unknown): void {
  const data = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) });
  res.end(data);
}

let active = 0;

const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/health") {
    send(res, 200, { status: "ok", active });
    return;
  }
  if (req.method !== "POST" || req.url !== "/rollouts") {
    send(res, 404, { error: { type: "NotFound", message: `no route for ${req.method} ${req.url}` } });
    return;
  }
  const chunks: Buffer[] = [];
  req.on("data", (chunk: Buffer) => chunks.push(chunk));
  req.on("end", async () => {
    let job: RolloutRequest;
    try {
      job = JSON.parse(Buffer.concat(chunks).toString("utf8")) as RolloutRequest;
    } catch (err) {
      send(res, 400, { error: { type: "InvalidRequest", message: String(err) } });
      return;
    }
    active++;
    try {
      send(res, 200, await rollout(job));
    } catch (err) {
      // The model endpoint failing is the infrastructure's fault (retried elsewhere); anything
      // else is this agent's.
      const infra = err instanceof OpenAI.APIConnectionError || (err instanceof OpenAI.APIError && (err.status ?? 0) >= 500);
      const error = err instanceof Error ? { type: err.name, message: err.message } : { type: "Error", message: String(err) };
      send(res, 422, { error, termination_reason: infra ? "infra_error" : "agent_error" });
    } finally {
      active--;
    }
  });
});

const arg = (name: string, fallback: string): string => {
  const at = process.argv.indexOf(name);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
};
const host = arg("--host", "127.0.0.1");
server.listen(Number(arg("--port", "8700")), host, () => {
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  console.log(`serving the TypeScript agent over the rLLM agent protocol at http://${host}:${port}`);
});
for (const signal of ["SIGINT", "SIGTERM"] as const) process.on(signal, () => server.close(() => process.exit(0)));
