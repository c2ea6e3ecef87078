#!/usr/bin/env bash
# Build Slurm 24.11 into a prefix of its own, beside Debian 12's packaged 22.05, so that the
# dev cluster can run on the Slurm that sites run today (`runyard dev up --slurm PREFIX`).
#
#   scripts/build_slurm.sh [PREFIX]        (default /opt/slurm-24.11; needs root for apt)
#
# The source is Debian 13's: the upstream tarball of its slurm-wlm 24.11.5 source package,
# from Debian's package archive, checked against the SHA-256 in trixie's signed Sources
# index. Only what runyard uses is configured: slurmctld, slurmd (several on one host),
# slurmdbd with the MySQL/MariaDB storage plugin, the client commands, munge auth, and JSON
# output (`--json`: the data_parser plugins are built always; their serializer needs
# json-c). No slurmrestd (JWT, http-parser, YAML), PMIx, hwloc, NVML, Lua, PAM or sview.
#
# Cached twice: the tarball under $RUNYARD_SLURM_CACHE (default /var/cache/runyard/slurm),
# and the installed prefix, stamped with the version and configure flags once `make
# install` has finished; a second run finds the stamp and exits in well under a second.
# Remove the prefix to build again. The build uses `nice -n 19 make -j2`: it shares the
# machine with tests. It prints how long it took.
set -euo pipefail

SLURM_VERSION=24.11.5
# trixie/main Sources: slurm-wlm 24.11.5-4+deb13u1, Checksums-Sha256 of the orig tarball.
ORIG_TARBALL="slurm-wlm_${SLURM_VERSION}.orig.tar.gz"
ORIG_SHA256=e1a5547edd212c38b5e3230a284133f777b32746551f094aaa81cc4af375e332
ARCHIVE_URL="${RUNYARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/s/slurm-wlm"

PREFIX="${1:-/opt/slurm-24.11}"
CACHE_DIR="${RUNYARD_SLURM_CACHE:-/var/cache/runyard/slurm}"
JOBS="${RUNYARD_BUILD_JOBS:-2}"
BUILD_DEPS=(libmunge-dev libjson-c-dev libmariadb-dev)

CONFIGURE_FLAGS=(
  "--prefix=$PREFIX"
  "--sysconfdir=$PREFIX/etc"
  --disable-static # libtool would compile every library source twice (PIC and not)
  --enable-multiple-slurmd # several `slurmd -N gpuNNN` on one host, as the 22.05 dev cluster
  --with-munge
  --with-json
  --disable-debug
  --disable-slurmrestd
  --disable-sview
  --disable-x11
  --disable-pam
  --without-jwt
  --without-http-parser
  --without-yaml
  --without-pmix
  --without-hwloc
  --without-nvml
  --without-rsmi
  --without-ucx
  --without-lua
  --without-hdf5
  --without-freeipmi
  --without-rdkafka
  --without-lz4
  --without-bpf
  --without-readline
)
STAMP="$PREFIX/.runyard-build"
STAMP_TEXT="slurm $SLURM_VERSION ${ORIG_SHA256} ${CONFIGURE_FLAGS[*]}"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_TEXT" ]]; then
  echo "Slurm $SLURM_VERSION is already built in $PREFIX (cached: $STAMP); remove $PREFIX to rebuild"
  exit 0
fi

started=$SECONDS
say() { echo "[build_slurm $((SECONDS - started))s] $*"; }

missing=()
for pkg in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if ((EUID != 0)); then
    echo "build_slurm: missing build packages ${missing[*]}; run: sudo apt-get install ${missing[*]}" >&2
    exit 2
  fi
  say "installing build packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE_DIR"
tarball="$CACHE_DIR/$ORIG_TARBALL"
if ! echo "$ORIG_SHA256  $tarball" | sha256sum --check --status 2>/dev/null; then
  say "downloading $ARCHIVE_URL/$ORIG_TARBALL"
  curl -fsSL --retry 3 -o "$tarball.part" "$ARCHIVE_URL/$ORIG_TARBALL"
  if ! echo "$ORIG_SHA256  $tarball.part" | sha256sum --check --status; then
    echo "build_slurm: $ORIG_TARBALL does not match trixie's SHA-256 $ORIG_SHA256" >&2
    exit 3
  fi
  mv "$tarball.part" "$tarball"
fi

# The build tree lives in the cache, not the repository; a build cut off part way resumes
# there (make is incremental). It is removed once the prefix is installed and stamped.
build_dir="$CACHE_DIR/build-$SLURM_VERSION"
if [[ ! -f "$build_dir/.configured" || "$(cat "$build_dir/.configured")" != "$STAMP_TEXT" ]]; then
  rm -rf "$build_dir"
  mkdir -p "$build_dir"
  say "unpacking $ORIG_TARBALL"
  tar xzf "$tarball" -C "$build_dir" --strip-components=1
  say "configuring for $PREFIX"
  (cd "$build_dir" && nice -n 19 ./configure "${CONFIGURE_FLAGS[@]}" >configure.out 2>&1) || {
    tail -20 "$build_dir/configure.out" >&2
    exit 4
  }
  echo "$STAMP_TEXT" >"$build_dir/.configured"
fi

say "compiling with nice -n 19 make -j$JOBS (log: $build_dir/make.out)"
(cd "$build_dir" && nice -n 19 make -j"$JOBS" >make.out 2>&1) || {
  tail -30 "$build_dir/make.out" >&2
  exit 5
}
say "installing into $PREFIX"
(cd "$build_dir" && nice -n 19 make install >install.out 2>&1) || {
  tail -30 "$build_dir/install.out" >&2
  exit 6
}
for plugin in serializer_json.so accounting_storage_mysql.so topology_block.so; do
  [[ -f "$PREFIX/lib/slurm/$plugin" ]] || {
    echo "build_slurm: $PREFIX/lib/slurm/$plugin was not built (see $build_dir/configure.out)" >&2
    exit 7
  }
done
echo "$STAMP_TEXT" >"$STAMP"
rm -rf "$build_dir"
elapsed=$((SECONDS - started))
say "built Slurm $SLURM_VERSION into $PREFIX in $((elapsed / 60))m$((elapsed % 60))s"
