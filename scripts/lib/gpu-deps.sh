# The staged Debian packages (scripts/stage-gpu-deps) made usable without root: sourced by
# scripts/gpu-check, which unpacks them on the GPU machine, and by scripts/stage-gpu-deps
# --rehearse, which does the same here before the trip. Needs DEBS (the .debs and SHA256SUMS),
# ROOT (where they are unpacked) and ARCH_TRIPLET.

# extract_deb DEB DIR: dpkg-deb -x, or without dpkg: a .deb is an ar archive holding data.tar.*.
extract_deb() {
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
    return
  fi
  local member z
  member=$(ar t "$1" | grep -m 1 '^data\.tar') || return 1
  case "$member" in
    *.xz) z=-J ;; *.gz) z=-z ;; *.zst) z=--zstd ;; *.bz2) z=-j ;; *) z='' ;;
  esac
  ar p "$1" "$member" | tar -x ${z:+"$z"} -f - -C "$2"
}

# The staged .debs, made usable from $ROOT (once per SHA256SUMS).
unpack_debs() {
  local stamp f n=0
  stamp=$(sha256sum "$DEBS/SHA256SUMS" | cut -d' ' -f1)
  if [ -f "$ROOT/.stamp" ] && [ "$(cat "$ROOT/.stamp")" = "$stamp" ]; then
    echo "# $ROOT already holds this set (stamp $stamp)"
    return 0
  fi
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  while read -r _ f; do
    f=${f#\*}
    extract_deb "$DEBS/$f" "$ROOT" || { echo "!! unpacking $f failed"; return 1; }
    n=$((n + 1))
  done <"$DEBS/SHA256SUMS"
  echo "# unpacked $n .deb files into $ROOT ($(du -sh "$ROOT" | cut -f1))"
  relocate_root
  echo "$stamp" >"$ROOT/.stamp"
}

# Makes the unpacked tree usable where it is: .pc files and h5cc name $ROOT/usr instead of /usr,
# absolute links point into $ROOT (or to the machine's library of the same name), and each
# library soname the machine already has (ldconfig -p) becomes a link to the machine's copy.
relocate_root() {
  case "$ROOT" in *[\#\&\\]*) echo "!! $ROOT: a '#', '&' or backslash in the path"; return 1 ;; esac
  local l t f name n_pc=0 n_abs=0 n_sys=0 n_dangling=0
  while IFS= read -r -d '' f; do
    sed -i -E "s#(^[A-Za-z_.]+=|-I|-L)/usr(/|\$)#\\1$ROOT/usr\\2#g" "$f"
    n_pc=$((n_pc + 1))
  done < <(find "$ROOT" -name '*.pc' -type f -print0)
  for f in h5cc h5c++ h5fc; do
    [ -f "$ROOT/usr/bin/$f" ] && sed -i "s#^prefix=\"/usr\"#prefix=\"$ROOT/usr\"#" "$ROOT/usr/bin/$f"
  done
  declare -A SYS=()
  while read -r name t; do
    [ -n "${SYS[$name]:-}" ] || SYS[$name]=$t
  done < <({ ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } |
    awk '/x86-64/ && /=>/ { print $1, $NF }')
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    if [ -e "$ROOT$t" ]; then
      ln -sfn "$ROOT$t" "$l"
      n_abs=$((n_abs + 1))
    fi
  done < <(find "$ROOT" -type l -lname '/*' -print0)
  for f in "$ROOT/usr/lib/$ARCH_TRIPLET"/lib*.so.* "$ROOT/lib/$ARCH_TRIPLET"/lib*.so.*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    name=${f##*/}
    t=${SYS[$name]:-}
    if [ -n "$t" ] && [ -e "$t" ]; then
      ln -sfn "$t" "$f"
      n_sys=$((n_sys + 1))
    fi
  done
  # Development links left dangling (libz.so -> /lib/.../libz.so.1.2.13 of another release): to
  # the machine's library of that name with the shortest version, e.g. libz.so.1.
  while IFS= read -r -d '' l; do
    [ -e "$l" ] && continue
    name=${l##*/}
    name=${name%%.so*}.so
    t=$(for k in "${!SYS[@]}"; do [[ "$k" == "$name".* ]] && echo "${SYS[$k]}"; done | awk '{ print length, $0 }' | sort -n | head -n 1 | cut -d' ' -f2-)
    if [ -n "$t" ]; then ln -sfn "$t" "$l"; else n_dangling=$((n_dangling + 1)); echo "# dangling: $l -> $(readlink "$l")"; fi
  done < <(find "$ROOT" -type l -name 'lib*.so*' -print0)
  echo "# relocated $n_pc .pc files and h5cc; $n_abs absolute links into the root; $n_sys libraries linked to the machine's copy; $n_dangling dangling links"
  echo "$n_sys libs from the machine$([ "$n_dangling" = 0 ] || echo ", $n_dangling dangling links")" >"$ROOT/.relocated"
}

# check_staged: the staged .debs are exactly those SHA256SUMS names. A missing one would leave a
# hole in the unpacked tree; an extra one (not unpacked: unpack_debs reads SHA256SUMS) means the
# directory is not one staging's output. Sets STAGED_PROBLEM to the first problem, naming the file.
STAGED_PROBLEM=''
check_staged() {
  local named present missing extra
  named=$(sed -E 's/^[0-9a-fA-F]{64} [ *]//' "$DEBS/SHA256SUMS" | LC_ALL=C sort)
  present=$(cd "$DEBS" && for f in *.deb; do if [ -e "$f" ]; then echo "$f"; fi; done | LC_ALL=C sort)
  missing=$(LC_ALL=C comm -23 <(sed '/^$/d' <<<"$named") <(sed '/^$/d' <<<"$present"))
  extra=$(LC_ALL=C comm -13 <(sed '/^$/d' <<<"$named") <(sed '/^$/d' <<<"$present"))
  STAGED_PROBLEM=''
  if [ -n "$missing" ]; then
    STAGED_PROBLEM="$(wc -l <<<"$missing") .deb named in SHA256SUMS missing: $(head -n 3 <<<"$missing" | paste -sd' ' -)"
  elif [ -n "$extra" ]; then
    STAGED_PROBLEM="$(wc -l <<<"$extra") .deb not named in SHA256SUMS: $(head -n 3 <<<"$extra" | paste -sd' ' -)"
  fi
  [ -z "$STAGED_PROBLEM" ]
}

