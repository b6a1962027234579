import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { INSTALL_FIX, locateCtxd } from "../src/protocol/locate";

describe("locateCtxd", () => {
  let root: string;
  let binDir: string;
  let venv: string;

  before(() => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-locate-"));
    binDir = path.join(root, "bin-on-path");
    venv = path.join(root, "venv");
    fs.mkdirSync(binDir);
    fs.mkdirSync(path.join(venv, "bin"), { recursive: true });
    for (const file of [path.join(binDir, "ctxd"), path.join(venv, "bin", "ctxd")]) {
      fs.writeFileSync(file, "#!/bin/sh\n");
      fs.chmodSync(file, 0o755);
    }
    fs.writeFileSync(path.join(root, "not-executable"), "");
  });

  after(() => fs.rmSync(root, { recursive: true, force: true }));

  it("prefers ctxd.path, then ctxd.venv, then PATH", () => {
    const onPath = path.join(binDir, "ctxd");
    const inVenv = path.join(venv, "bin", "ctxd");
    assert.deepEqual(locateCtxd({ configuredPath: inVenv, venv, envPath: binDir }), { ok: true, command: inVenv, source: "setting" });
    assert.deepEqual(locateCtxd({ venv, envPath: binDir }), { ok: true, command: inVenv, source: "venv" });
    assert.deepEqual(locateCtxd({ envPath: `/nonexistent:${binDir}` }), { ok: true, command: onPath, source: "PATH" });
  });

  it("resolves a relative venv against the workspace folder, and a bare name on PATH", () => {
    assert.deepEqual(locateCtxd({ venv: "venv", baseDir: root, envPath: "" }),
      { ok: true, command: path.join(venv, "bin", "ctxd"), source: "venv" });
    assert.deepEqual(locateCtxd({ configuredPath: "ctxd", envPath: binDir }),
      { ok: true, command: path.join(binDir, "ctxd"), source: "setting" });
  });

  it("explains what is wrong and how to fix it", () => {
    const none = locateCtxd({ envPath: "/nonexistent" });
    assert.equal(none.ok, false);
    if (!none.ok) {
      assert.match(none.problem, /not installed/);
      assert.equal(none.fix, INSTALL_FIX);
    }
    const bad = locateCtxd({ configuredPath: path.join(root, "not-executable"), envPath: binDir });
    assert.ok(!bad.ok && /not an executable file/.test(bad.problem));
    const emptyVenv = locateCtxd({ venv: binDir, envPath: binDir });
    assert.ok(!emptyVenv.ok && /has no ctxd/.test(emptyVenv.problem) && /pip/.test(emptyVenv.fix));
  });
});
