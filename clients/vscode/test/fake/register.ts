/** Makes `require("vscode")` return the fake (import this before any UI module). */
import Module from "module";
import * as fake from "./vscode";

type Load = (this: unknown, request: string, parent: unknown, isMain: boolean) => unknown;
const loader = Module as unknown as { _load: Load };
const original = loader._load;
loader._load = function (this: unknown, request: string, parent: unknown, isMain: boolean): unknown {
  return request === "vscode" ? fake : original.call(this, request, parent, isMain);
};
