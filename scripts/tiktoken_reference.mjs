// scripts/tiktoken_reference.mjs: the reference side of normtape's BPE tokenizer, in node, over the
// npm package `tiktoken` (the WASM build of OpenAI's tokenizer) that scripts/fetch_tiktoken.sh
// unpacks into DIR/tiktoken.
//
//   node scripts/tiktoken_reference.mjs export DIR
//     For gpt2, cl100k_base and o200k_base: DIR/NAME.tiktoken, tiktoken's rank file (a token's
//     bytes in base64 and its rank, one a line), and DIR/NAME.json (pat_str, special_tokens,
//     n_vocab), from the package's encoders/NAME.json. Every rank's bytes are checked against the
//     WASM encoder's decode_single_token_bytes; ranks must be distinct and tokens unique.
//   node scripts/tiktoken_reference.mjs encode DIR NAME INPUT OUTPUT [--special]
//     Encodes INPUT (a UTF-8 file) with encoding NAME, ordinary text only or, with --special, special
//     tokens allowed ("all"); writes the ids to OUTPUT as little-endian uint32 and prints the count
//     and the encoding's time in ms (one call, one thread). Exits 2 on a file that is not UTF-8:
//     a JavaScript string cannot hold its bytes.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";

const ENCODINGS = ["gpt2", "cl100k_base", "o200k_base"];

function fail(message) {
    console.error(`tiktoken_reference: ${message}`);
    process.exit(2);
}

function load(dir) {
    const require = createRequire(join(dir, "tiktoken", "package.json"));
    try {
        return require(join(dir, "tiktoken", "tiktoken.cjs"));
    } catch (e) {
        fail(`no tiktoken package under ${dir}/tiktoken (run scripts/fetch_tiktoken.sh): ${e.message}`);
    }
}

// The package's bpe_ranks: lines "! OFFSET TOKEN..." whose base64 tokens take ranks OFFSET, OFFSET + 1, ...
function ranks(name, bpe) {
    const out = [];
    for (const line of bpe.split("\n")) {
        if (line.length === 0) continue;
        const parts = line.split(" ");
        if (parts[0] !== "!" || !/^[0-9]+$/.test(parts[1])) fail(`${name}: a bpe_ranks line starts ${parts.slice(0, 2)}`);
        const offset = Number(parts[1]);
        parts.slice(2).forEach((token, i) => out.push([token, offset + i]));
    }
    return out;
}

function exportAll(dir) {
    const tiktoken = load(dir);
    for (const name of ENCODINGS) {
        const json = JSON.parse(readFileSync(join(dir, "tiktoken", "encoders", `${name}.json`), "utf8"));
        const list = ranks(name, json.bpe_ranks);
        const encoding = tiktoken.get_encoding(name);
        const seen = new Set(), used = new Set();
        for (const [token, rank] of list) {
            if (seen.has(token)) fail(`${name}: token ${token} appears twice`);
            if (used.has(rank)) fail(`${name}: rank ${rank} appears twice`);
            seen.add(token);
            used.add(rank);
            const wasm = Buffer.from(encoding.decode_single_token_bytes(rank));
            if (!wasm.equals(Buffer.from(token, "base64")))
                fail(`${name}: rank ${rank} is ${token} in encoders/${name}.json but ${wasm.toString("base64")} in the encoder`);
        }
        encoding.free();
        const top = [...list.map(([, rank]) => rank), ...Object.values(json.special_tokens)].reduce((a, b) => Math.max(a, b));
        writeFileSync(join(dir, `${name}.tiktoken`), list.map(([token, rank]) => `${token} ${rank}\n`).join(""));
        const meta = { pat_str: json.pat_str, special_tokens: json.special_tokens, n_vocab: json.explicit_n_vocab ?? top + 1 };
        writeFileSync(join(dir, `${name}.json`), JSON.stringify(meta, null, 2) + "\n");
        console.log(`${name}: ${list.length} ranks, ${Object.keys(json.special_tokens).length} special tokens, ` +
                    `n_vocab ${meta.n_vocab}`);
    }
}

function encode(dir, name, input, output, special) {
    if (!ENCODINGS.includes(name)) fail(`expected an encoding among ${ENCODINGS.join(", ")}, got ${name}`);
    const bytes = readFileSync(input);
    const text = bytes.toString("utf8");
    if (!Buffer.from(text, "utf8").equals(bytes)) fail(`${input} is not UTF-8: a JavaScript string cannot hold its bytes`);
    const encoding = load(dir).get_encoding(name);
    const start = performance.now();
    const ids = special ? encoding.encode(text, "all") : encoding.encode_ordinary(text);
    const ms = performance.now() - start;
    encoding.free();
    const out = Buffer.alloc(4 * ids.length);
    ids.forEach((id, i) => out.writeUInt32LE(id, 4 * i));
    writeFileSync(output, out);
    console.log(`${name}: ${ids.length} tokens from ${bytes.length} bytes in ${ms.toFixed(1)} ms`);
}

const [command, ...args] = process.argv.slice(2);
if (command === "export" && args.length === 1) exportAll(args[0]);
else if (command === "encode" && (args.length === 4 || (args.length === 5 && args[4] === "--special")))
    encode(args[0], args[1], args[2], args[3], args.length === 5);
else fail("usage: tiktoken_reference.mjs export DIR | encode DIR NAME INPUT OUTPUT [--special]");
