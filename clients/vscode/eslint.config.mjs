// @ts-check
import eslint from "@eslint/js";
import tseslint from "typescript-eslint";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";

export default tseslint.config(
  { ignores: ["out/**", "node_modules/**", "*.vsix"] },
  eslint.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: { allowDefaultProject: ["eslint.config.mjs"] }, tsconfigRootDir: dirname(fileURLToPath(import.meta.url)) },
    },
    rules: {
      "@typescript-eslint/explicit-function-return-type": ["error", { allowExpressions: true }],
      "@typescript-eslint/no-floating-promises": ["error", {
        allowForKnownSafeCalls: [{ from: "package", name: ["describe", "it", "test"], package: "node:test" }],
      }],
      "@typescript-eslint/no-explicit-any": "error",
      eqeqeq: "error",
      curly: "error",
    },
  },
  {
    files: ["eslint.config.mjs"],
    extends: [tseslint.configs.disableTypeChecked],
  },
);
