/**
 * Finding the `ctxd` executable: the `ctxd.path` setting, else a configured venv
 * (`ctxd.venv`), else PATH. Plain node (no `vscode`), so it is tested directly.
 */
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

export interface LocateOptions {
  /** `ctxd.path`: an executable file, or a command name looked up on PATH. */
  configuredPath?: string;
  /** `ctxd.venv`: a virtual environment holding ctxd (bin/ctxd, or Scripts\ctxd.exe on Windows). */
  venv?: string;
  /** Where a relative `ctxd.venv` or `ctxd.path` is resolved (the first workspace folder). */
  baseDir?: string;
  /** The PATH to search (process.env.PATH by default). */
  envPath?: string;
  platform?: NodeJS.Platform;
}

export type Located =
  | { ok: true; command: string; source: "setting" | "venv" | "PATH" }
  | { ok: false; problem: string; fix: string };

/** What to tell someone who has no ctxd: the install commands and the settings. */
export const INSTALL_FIX =
  "Install ctxd (from a ctxd checkout: `python3 -m venv .venv && .venv/bin/pip install .`), then set " +
  "`ctxd.venv` to that venv or `ctxd.path` to its `bin/ctxd`, or put `ctxd` on PATH, and run " +
  "\"ctxd: Reconnect\".";

function expandHome(p: string): string {
  return p === "~" || p.startsWith("~/") ? path.join(os.homedir(), p.slice(1)) : p;
}

function isExecutableFile(file: string, platform: NodeJS.Platform): boolean {
  try {
    const stat = fs.statSync(file);
    if (!stat.isFile()) {
      return false;
    }
    if (platform === "win32") {
      return true;
    }
    fs.accessSync(file, fs.constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function executableNames(name: string, platform: NodeJS.Platform): string[] {
  return platform === "win32" ? [`${name}.exe`, `${name}.cmd`, name] : [name];
}

/** The first executable `name` on `envPath`, or undefined. */
export function whichSync(name: string, envPath: string, platform: NodeJS.Platform = process.platform): string | undefined {
  const separator = platform === "win32" ? ";" : ":";
  for (const dir of envPath.split(separator)) {
    if (!dir) {
      continue;
    }
    for (const candidate of executableNames(name, platform)) {
      const file = path.join(dir, candidate);
      if (isExecutableFile(file, platform)) {
        return file;
      }
    }
  }
  return undefined;
}

export function locateCtxd(options: LocateOptions = {}): Located {
  const platform = options.platform ?? process.platform;
  const envPath = options.envPath ?? process.env.PATH ?? "";
  const resolve = (p: string): string => {
    const expanded = expandHome(p.trim());
    return path.isAbsolute(expanded) || !options.baseDir ? path.resolve(expanded) : path.resolve(options.baseDir, expanded);
  };

  const configured = options.configuredPath?.trim();
  if (configured) {
    const isName = !configured.includes("/") && !configured.includes("\\") && !configured.startsWith("~");
    if (isName) {
      const found = whichSync(configured, envPath, platform);
      if (found) {
        return { ok: true, command: found, source: "setting" };
      }
      return {
        ok: false,
        problem: `ctxd.path is "${configured}", which is not on PATH.`,
        fix: `Set ctxd.path to the full path of the ctxd executable. ${INSTALL_FIX}`,
      };
    }
    const file = resolve(configured);
    if (isExecutableFile(file, platform)) {
      return { ok: true, command: file, source: "setting" };
    }
    return {
      ok: false,
      problem: `ctxd.path is "${configured}", which is not an executable file.`,
      fix: `Point ctxd.path at ctxd's executable (a venv's bin/ctxd), or clear it to search PATH. ${INSTALL_FIX}`,
    };
  }

  const venv = options.venv?.trim();
  if (venv) {
    const root = resolve(venv);
    const candidates = platform === "win32"
      ? executableNames("ctxd", platform).map((n) => path.join(root, "Scripts", n))
      : [path.join(root, "bin", "ctxd")];
    for (const file of candidates) {
      if (isExecutableFile(file, platform)) {
        return { ok: true, command: file, source: "venv" };
      }
    }
    return {
      ok: false,
      problem: `The venv in ctxd.venv (${root}) has no ctxd.`,
      fix: `Install ctxd into it (\`${path.join(root, platform === "win32" ? "Scripts" : "bin", "pip")} install <ctxd checkout>\`) or change ctxd.venv.`,
    };
  }

  const found = whichSync("ctxd", envPath, platform);
  if (found) {
    return { ok: true, command: found, source: "PATH" };
  }
  return { ok: false, problem: "ctxd is not installed (no `ctxd` on PATH, and neither ctxd.path nor ctxd.venv is set).", fix: INSTALL_FIX };
}
