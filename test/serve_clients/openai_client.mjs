// The official openai package against xfmr-serve, as an application uses it:
//   node openai_client.mjs BASE_URL API_KEY
// Streams a chat completion and a completion, checks them against the whole
// answers, logprobs and n choices, and that errors reach the client as the
// package's own.
import OpenAI from "openai";

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
const fail = (what) => { console.error(`openai_client: ${what}`); process.exit(1); };

const models = await client.models.list();
const model = models.data[0]?.id;
if (!model) fail("no model listed");

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];
const whole = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
let streamed = "", chunks = 0, finish = null;
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, stream: true })) {
  chunks++;
  streamed += chunk.choices[0]?.delta?.content ?? "";
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
if (chunks < 2) fail(`the chat stream had ${chunks} chunks`);
if (streamed !== whole.choices[0].message.content) fail(`chat: streamed ${JSON.stringify(streamed)} != whole ${JSON.stringify(whole.choices[0].message.content)}`);
if (finish !== whole.choices[0].finish_reason) fail(`chat: finish ${finish} != ${whole.choices[0].finish_reason}`);
if (whole.usage.completion_tokens < 1) fail("chat: no usage");
console.log(`chat: ${chunks} chunks, finish_reason ${finish}, ${whole.usage.completion_tokens} tokens`);

const prompt = "Once upon a time";
const plain = await client.completions.create({ model, prompt, max_tokens: 10, temperature: 0, seed: 3 });
let text = "";
chunks = 0;
for await (const chunk of await client.completions.create({ model, prompt, max_tokens: 10, temperature: 0, seed: 3, stream: true })) {
  chunks++;
  text += chunk.choices[0]?.text ?? "";
}
if (text !== plain.choices[0].text) fail(`completion: streamed ${JSON.stringify(text)} != whole ${JSON.stringify(plain.choices[0].text)}`);
console.log(`completion: ${chunks} chunks, ${plain.usage.completion_tokens} tokens`);

// logprobs (chat's shape), and n choices each equal to its lone request.
const withLogprobs = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 });
const content = withLogprobs.choices[0].logprobs?.content ?? [];
if (content.length !== withLogprobs.usage.completion_tokens) fail(`logprobs: ${content.length} entries for ${withLogprobs.usage.completion_tokens} tokens`);
if (content.some((t) => t.top_logprobs.length !== 2 || t.logprob !== t.top_logprobs[0].logprob)) fail("logprobs: a greedy token is not its step's likeliest");
const three = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0.8, seed: 11, n: 3 });
for (let i = 0; i < 3; i++) {
  const alone = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0.8, seed: 11 + i });
  if (three.choices[i].text !== alone.choices[0].text) fail(`n: choice ${i} is not its lone request`);
}
console.log(`logprobs: ${content.length} tokens; n: 3 choices, ${three.usage.completion_tokens} tokens`);
// Structured output: a JSON schema's value, parsed by the application.
const schema = { type: "object", properties: { answer: { type: "string", maxLength: 8 }, sure: { type: "boolean" } }, required: ["answer", "sure"] };
const structured = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 40, seed: 5,
  response_format: { type: "json_schema", json_schema: { name: "reply", schema } } });
const reply = JSON.parse(structured.choices[0].message.content);
if (typeof reply.answer !== "string" || typeof reply.sure !== "boolean") fail(`response_format: ${structured.choices[0].message.content}`);
console.log(`response_format: ${structured.choices[0].message.content}`);
// Tools: a forced call, its result sent back, and the conversation going on.
const tools = [{ type: "function", function: { name: "weather", description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 6 } }, required: ["city"] } } }];
const ask = [{ role: "user", content: "Weather?" }];
const called = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: "required", max_tokens: 80 });
const call = called.choices[0].message.tool_calls?.[0];
if (called.choices[0].finish_reason !== "tool_calls" || call?.function.name !== "weather" || typeof JSON.parse(call.function.arguments).city !== "string")
  fail(`tools: ${JSON.stringify(called.choices[0])}`);
const after = await client.chat.completions.create({ model, tools, max_tokens: 4,
  messages: [...ask, called.choices[0].message, { role: "tool", tool_call_id: call.id, content: "sunny" }] });
if (!after.choices[0].message) fail("tools: no answer after the result");
console.log(`tools: ${call.function.name}(${call.function.arguments}), then ${after.usage.prompt_tokens} prompt tokens`);
// Embeddings (the package asks for base64 and decodes it).
const embedded = await client.embeddings.create({ model, input: ["Once upon a time", "Once upon a time", "Hello"] });
const [a, b, c] = embedded.data.map((d) => d.embedding);
const length = Math.sqrt(a.reduce((s, x) => s + x * x, 0));
if (embedded.data.length !== 3 || Math.abs(length - 1) > 1e-5) fail(`embeddings: ${embedded.data.length} vectors, length ${length}`);
if (a.some((x, i) => x !== b[i]) || a.every((x, i) => x === c[i])) fail("embeddings: one text gave two vectors, or two texts one");
console.log(`embeddings: 3 vectors of ${a.length}`);

try {
  await client.completions.create({ model, prompt, max_tokens: 100000 });
  fail("max_tokens past the context was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError) || !String(e.message).includes("max_tokens")) fail(`expected a BadRequestError naming max_tokens, got ${e}`);
}
try {
  await new OpenAI({ baseURL: `${base}/v1`, apiKey: "wrong", maxRetries: 0 }).models.list();
  fail("a wrong API key was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.AuthenticationError)) fail(`expected an AuthenticationError, got ${e}`);
}
console.log("openai_client: ok");
