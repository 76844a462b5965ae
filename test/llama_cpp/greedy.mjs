// llama.cpp's reading of a GGUF file, through node-llama-cpp's prebuilt CPU
// library: what agreement.py compares xfmr with.
//
//   node greedy.mjs PROMPT N MODEL.gguf...
//
// Prints a JSON object a model, a line each: the prompt's ids (BOS first where the file asks
// for it, as llama.cpp's programs do), the N greedy ids that follow and
// their text, and the probabilities of every token after the prompt
// (temperature 1, no top-k, top-p or min-p).
import {getLlama} from "node-llama-cpp";

const [, , prompt, n, ...files] = process.argv;
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
for (const file of files) {
  const model = await llama.loadModel({modelPath: file});
  const context = await model.createContext({contextSize: 256, threads: 1});  // tiny models: no thread pool
  const ids = model.tokenize(prompt);
  if (model.tokens.shouldPrependBosToken && model.tokens.bos != null) ids.unshift(model.tokens.bos);
  const greedy = [];
  const sequence = context.getSequence();
  for await (const t of sequence.evaluate(ids, {temperature: 0, yieldEogToken: true})) {
    greedy.push(t);
    if (greedy.length >= Number(n)) break;
  }
  await sequence.clearHistory();
  let probabilities = [];
  for await (const o of sequence.evaluateWithMetadata(ids, {probabilities: true},
                                                      {temperature: 1, topK: 0, topP: 1, minP: 0})) {
    probabilities = [...o.probabilities.entries()];
    break;
  }
  console.log(JSON.stringify({file, prompt: ids, greedy, text: model.detokenize(greedy), probabilities}));
  await context.dispose();
  await model.dispose();
}
process.exit(0);
