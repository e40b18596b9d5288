// Microsoft's KQL parser (npm @kusto/language-service-next) over queries and management commands.
// stdin: {"database": NAME, "tables": {TABLE: {COLUMN: TYPE}}, "functions": {NAME: BODY}, "texts": {NAME: KQL}}
// stdout: {NAME: [{"severity", "code", "message", "start", "length"}]} — every diagnostic, errors and warnings.
"use strict";
const path = require("path");
const dir = path.resolve(process.argv[2]);
require(path.join(dir, "bridge.min.js"));
require(path.join(dir, "Kusto.Language.Bridge.min.js"));
const K = global.Kusto.Language;

let input = "";
process.stdin.on("data", (d) => { input += d; });
process.stdin.on("end", () => {
  const req = JSON.parse(input);
  const tables = Object.entries(req.tables).map(([name, cols]) => {
    const schema = "(" + Object.entries(cols).map(([c, t]) => `['${c}']:${t}`).join(", ") + ")";
    return new K.Symbols.TableSymbol.$ctor7(name, schema, "");
  });
  // Stored functions (no parameters): {NAME: BODY}, resolved against the tables like the cluster does.
  const functions = Object.entries(req.functions || {}).map(
    ([name, body]) => new K.Symbols.FunctionSymbol.$ctor16(name, "()", `{ ${body} }`, ""));
  const db = new K.Symbols.DatabaseSymbol.ctor(req.database, tables.concat(functions));
  const globals = K.GlobalState.Default.WithDatabase(db);
  const out = {};
  for (const [name, text] of Object.entries(req.texts)) {
    const code = K.KustoCode.ParseAndAnalyze(text, globals);
    const diags = code.GetDiagnostics();
    const list = [];
    for (let i = 0; i < diags.Count; i++) {
      const d = diags.getItem(i);
      list.push({ severity: d.Severity, code: d.Code, message: d.Message, start: d.Start, length: d.Length });
    }
    out[name] = { kind: code.Kind, diagnostics: list };
  }
  process.stdout.write(JSON.stringify(out));
});
