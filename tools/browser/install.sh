#!/usr/bin/env bash
# Debian's headless Chromium and its WebDriver for the report's browser tests
# (tests/test_report_browser.py, the demo run in tests/test_workflow.py) and for
# `stereolens report --screenshot`. Run as root; does nothing when both are installed.
set -euo pipefail
pkgs=(chromium chromium-driver fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "tools/browser/install.sh: already installed: ${pkgs[*]}"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "tools/browser/install.sh: must run as root to install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
chromium --version
chromedriver --version
