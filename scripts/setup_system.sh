#!/usr/bin/env bash
# System packages rlinf-nb needs on Debian 12 (bookworm), installed idempotently as root.
#  - mesa-vulkan-drivers from bookworm-backports: SAPIEN (ManiSkill) needs lavapipe from Mesa >= 24.3
#    (VK_KHR_external_semaphore_fd); bookworm's own Mesa 22.3 is too old.
#  - libvulkan1: the Vulkan loader.
#  - chromium: the browser the UI tests drive through Playwright (never `playwright install`).
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi

need=()
mesa_ok() {
  # Mesa's lavapipe must come from backports (version >= 24.3).
  local v
  v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  [ -n "$v" ] && dpkg --compare-versions "$v" ge 24.3
}
mesa_ok || need+=(mesa)
dpkg-query -W -f='${Status}' libvulkan1 2>/dev/null | grep -q "ok installed" || need+=(libvulkan1)
command -v chromium >/dev/null 2>&1 || need+=(chromium)

if [ ${#need[@]} -eq 0 ]; then
  echo "[setup-system] system packages already present (mesa lavapipe >= 24.3, libvulkan1, chromium)"
  exit 0
fi
echo "[setup-system] installing: ${need[*]}"

backports=/etc/apt/sources.list.d/rlinf-nb-backports.sources
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  $SUDO tee "$backports" >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers
$SUDO apt-get install -y -qq --no-install-recommends libvulkan1 chromium
echo "[setup-system] done"
