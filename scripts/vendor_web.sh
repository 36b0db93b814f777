#!/usr/bin/env bash
# Fetch the dashboard's vendored libraries again from the npm registry, at the versions
# raytrain/serve/web/vendor/README.md names, and print their sha256 to compare with it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=raytrain/serve/web/vendor
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent uplot@1.6.32 js-yaml@4.1.0 swagger-ui-dist@5.35.0 redoc@2.5.2 >/dev/null
 for f in *.tgz; do mkdir "${f%.tgz}" && tar xzf "$f" -C "${f%.tgz}"; done)
cp "$work"/uplot-*/package/dist/uPlot.iife.min.js "$work"/uplot-*/package/dist/uPlot.min.css "$out"/
cp "$work"/uplot-*/package/LICENSE "$out"/uPlot.LICENSE
cp "$work"/js-yaml-*/package/dist/js-yaml.min.js "$out"/
cp "$work"/js-yaml-*/package/LICENSE "$out"/js-yaml.LICENSE
cp "$work"/swagger-ui-dist-*/package/{swagger-ui-bundle.js,swagger-ui.css,swagger-ui-bundle.js.LICENSE.txt} "$out"/
cp "$work"/swagger-ui-dist-*/package/LICENSE "$out"/swagger-ui.LICENSE
cp "$work"/swagger-ui-dist-*/package/NOTICE "$out"/swagger-ui.NOTICE
cp "$work"/redoc-*/package/bundles/{redoc.standalone.js,redoc.standalone.js.LICENSE.txt} "$out"/
cp "$work"/redoc-*/package/LICENSE "$out"/redoc.LICENSE
(cd "$out" && sha256sum ./*.js ./*.css)
