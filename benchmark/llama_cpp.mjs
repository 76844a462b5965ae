// llama.cpp's side of benchmark/llama_cpp.py: a GGUF file decoded and
// prefilled through node-llama-cpp's prebuilt CPU library, as llama-bench
// measures (a warm-up, then repetitions; generation and prompt apart).
//
//   node llama_cpp.mjs MODEL.gguf THREADS TG PP REPS
//
// PP 0: no prompt (a run whose peak memory is measured: a context of TG
// tokens, batches of 32).
// Prints one JSON object: load_s (loadModel and createContext), first_s
// (the first token from BOS, the weights' pages faulted in), tg_ms (a
// generated token's milliseconds, a value a repetition of TG tokens from
// BOS) and pp_tps (a prompt of PP tokens' tokens a second, a value a
// repetition).
import {getLlama} from "node-llama-cpp";

const [, , file, threads, tg, pp, reps] = process.argv;
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
let t = performance.now();
const model = await llama.loadModel({modelPath: file});
const context = await model.createContext({contextSize: Math.max(Number(pp), Number(tg)) + 8,
                                           batchSize: Number(pp) || 32, threads: Number(threads)});
const load_s = (performance.now() - t) / 1000;
const sequence = context.getSequence();
const bos = model.tokens.bos ?? 1;

// Generates n tokens greedily after `prompt`; returns the seconds to the
// first token and to the last.
async function generate(prompt, n) {
  await sequence.clearHistory();
  const start = performance.now();
  let first = 0, count = 0;
  for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
    if (count++ === 0) first = performance.now();
    if (count >= n) break;
  }
  return {first: (first - start) / 1000, total: (performance.now() - start) / 1000, count};
}

const first_s = (await generate([bos], 1)).first;
const tg_ms = [], pp_tps = [];
const prompt = Array.from({length: Number(pp)}, (_, i) => 100 + (i * 37) % 1000);
for (let r = -1; r < Number(reps); ++r) {  // r = -1: the warm-up
  const g = await generate([bos], Number(tg) + 1);  // the first token is the prompt's
  const p = prompt.length ? await generate(prompt, 1) : null;
  if (r < 0) continue;
  tg_ms.push(((g.total - g.first) / (g.count - 1)) * 1000);
  if (p) pp_tps.push(Number(pp) / p.first);
}
console.log(JSON.stringify({load_s, first_s, tg_ms, pp_tps, threads: Number(threads)}));
process.exit(0);
