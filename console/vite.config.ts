// The console is served by the gateway under /console/ from files embedded
// in the binary (crates/foldgate-console). The build writes them there.
//
// The output must be byte-identical from one build to the next (CI rebuilds
// and diffs it): file names carry content hashes only, no source maps, no
// timestamps.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/console/",
  publicDir: "public",
  build: {
    outDir: "../crates/foldgate-console/assets",
    emptyOutDir: true,
    assetsDir: "assets",
    sourcemap: false,
    target: "es2022",
    // Every browser the target admits supports modulepreload.
    modulePreload: { polyfill: false },
    // Keep the CSS in a file: the Content-Security-Policy allows no inline
    // styles or scripts.
    assetsInlineLimit: 0,
    reportCompressedSize: false,
  },
});
