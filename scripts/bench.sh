#!/usr/bin/env bash
# `make bench`: the long benchmarks behind BENCHMARKS.md, ddl and its peers side by side on the
# same files and the same cores, several runs each; prints medians and leaves every raw JSON line
# in bench-out/. Sections: pack, layouts, gzip, loader, allreduce, python, binding
# (BENCH_SECTIONS="pack layouts gzip loader allreduce python binding"; layouts: ddl-pack from each
# form ImageNet is downloaded in, the same images; gzip: from a gzip-compressed ImageNet-22k outer
# tar against gunzip first; python: the Python package against the Rust it binds and the PyTorch
# peers; binding: one rank under mpirun --bind-to core against --bind-to none; exchange: the
# records nodes trade under --exchange, their accuracy and their cost, not run by default: it
# needs root for the emulated cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BENCH_BIN:-target/release}
out=${BENCH_OUT:-bench-out}
runs=${BENCH_RUNS:-3}
sections=${BENCH_SECTIONS:-pack layouts gzip loader allreduce python binding}
classes=${BENCH_CLASSES:-100}
per_class=${BENCH_PER_CLASS:-50}
mkdir -p "$out"

# Peers live in their own virtualenvs (torchvision + Pillow + simplejpeg; FFCV with its pins).
ensure_peers() {
  if [ ! -x .venv-bench/bin/python ] || ! .venv-bench/bin/python -c "import torchvision, PIL, simplejpeg" 2>/dev/null; then
    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -q torch==2.11.0 torchvision==0.26.0 pillow simplejpeg numpy
  fi
  if [ ! -x .venv-ffcv/bin/python ] || ! .venv-ffcv/bin/python -c "import ffcv" 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libturbojpeg0-dev libopencv-dev pkg-config >/dev/null
    python3 -m venv .venv-ffcv
    .venv-ffcv/bin/pip install -q torch==2.11.0 torchvision==0.26.0 "numba==0.58.1" "numpy<1.27" \
      "opencv-python-headless<4.11" ffcv || echo "bench: FFCV did not install; its rows are skipped" >&2
  fi
}
have_ffcv() { .venv-ffcv/bin/python -c "import ffcv" 2>/dev/null; }

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { python3 -c "import json,sys; [print(json.loads(l)['$1']) for l in sys.stdin if l.strip().startswith('{')]"; }

# timed FILE JSON CMD...: runs CMD under /usr/bin/time and appends one JSON line to FILE: the
# command's own last JSON line (or JSON when CMD prints none) plus wall seconds, CPU seconds
# (user + sys of the whole process tree) and images per wall- and CPU-second. CPU time is the
# robust figure on a shared machine; wall time is what a user waits for.
timed() {
  local file=$1 json=$2; shift 2
  local printed
  printed=$(/usr/bin/time -o "$out/time.tmp" -f "%e %U %S" "$@" 2>/dev/null | grep '^{' | tail -n 1 || true)
  python3 - "$out/time.tmp" "${printed:-$json}" >> "$file" <<'PY'
import json, sys
wall, user, sys_ = map(float, open(sys.argv[1]).read().split()[-3:])
row = json.loads(sys.argv[2])
cpu = row.get("cpu_s", user + sys_)  # a peer's own figure covers its timed section only
row.update({"wall_s": wall, "cpu_s": cpu, "images_per_s": row["images"] / wall if "seconds" not in row else row["images_per_s"],
            "images_per_cpu_s": row["images"] / cpu})
print(json.dumps(row))
PY
}

tree=$out/imagenet
if [ ! -f "$tree/LOC_val_solution.csv" ]; then
  "$bin/ddl-synth" "$tree" --classes "$classes" --per-class "$per_class" --val-per-class 1 --seed 42
fi
ntrain=$(find "$tree/train" -name '*.JPEG' | wc -l)
echo "bench: $ntrain training JPEGs in $tree ($(du -sh "$tree/train" | cut -f1)) on $(nproc) cores"
case " $sections " in *" pack "*|*" loader "*|*" python "*) ensure_peers ;; esac

if [[ " $sections " == *" pack "* ]]; then
  echo "== pack: ddl-pack vs FFCV DatasetWriter vs Pillow loop (shorter side <= 256, q90, $runs runs)"
  : > "$out/pack.jsonl"
  for r in $(seq "$runs"); do
    rm -rf "$out/shards-pack" "$out/ffcv.beton"
    timed "$out/pack.jsonl" "{\"peer\": \"ddl-pack\", \"images\": $ntrain}" \
      "$bin/ddl-pack" "$tree" -o "$out/shards-pack" --shards 8 --max-short-side 256 --quality 90
    bytes=$(du -cb "$out"/shards-pack/train-*.ddl | tail -n 1 | cut -f1)
    sed -i '$ s/}$/, "bytes": '"$bytes"'}/' "$out/pack.jsonl"
    timed "$out/pack.jsonl" "" .venv-bench/bin/python tools/bench/pillow_pack.py "$tree" --max-short-side 256 --workers "$(nproc)"
    if have_ffcv; then
      timed "$out/pack.jsonl" "" .venv-ffcv/bin/python tools/bench/ffcv_write.py "$tree" "$out/ffcv.beton" --max-res 340 --workers "$(nproc)"
    fi
  done
  for p in ddl-pack ffcv-writer pillow-pack; do
    m=$(grep "\"$p\"" "$out/pack.jsonl" | field images_per_s | median)
    c=$(grep "\"$p\"" "$out/pack.jsonl" | field images_per_cpu_s | median)
    b=$(grep "\"$p\"" "$out/pack.jsonl" | field bytes | median)
    printf '%-14s median %8.1f images/s (wall)  %8.1f images per CPU-second  output %6.1f MiB\n' \
      "$p" "$m" "$c" "$(echo "$b / 1048576" | bc -l)"
  done
fi

# The same images as image-net.org's archives, extracted, Hugging Face's parquet and tars,
# WebDataset shards, Kaggle's zip, a tar of class folders and TensorFlow's TFRecord files
# (written by tools/bench/imagenet_layouts.py as the real ones are).
forms=$out/layouts
# The forms are written again when the script that writes them changes.
ensure_forms() {
  local done
  done=$forms/.done-$(sha1sum tools/bench/imagenet_layouts.py | cut -c1-12)
  if [ ! -f "$done" ]; then
    rm -rf "$forms"
    .venv/bin/python tools/bench/imagenet_layouts.py "$tree" "$forms" --per-shard 1250
    touch "$done"
  fi
}

if [[ " $sections " == *" layouts "* ]]; then
  # The forms take turns in each run.
  ensure_forms
  nall=$(( ntrain + $(find "$tree/val" -name '*.JPEG' | wc -l) ))
  echo "== layouts: ddl-pack from each download form, $nall images (shorter side <= 256, q90, $runs runs)"
  : > "$out/layouts.jsonl"
  for r in $(seq "$runs"); do
    for form in extracted downloads parquet wds hf-tars kaggle-zip tree-tar blurred tfds tpu-tfrecord; do
      rm -rf "$out/shards-$form"
      input=$forms/$form
      [ "$form" = kaggle-zip ] && input=$forms/$form/imagenet-object-localization-challenge.zip
      [ "$form" = tree-tar ] && input=$forms/$form/imagenet21k_resized.tar.gz
      [ "$form" = tfds ] && input=$forms/$form/imagenet2012
      timed "$out/layouts.jsonl" "{\"peer\": \"$form\", \"images\": $nall}" \
        "$bin/ddl-pack" "$input" -o "$out/shards-$form" --shards 8 --max-short-side 256 --quality 90
    done
  done
  base=$(grep '"extracted"' "$out/layouts.jsonl" | field images_per_s | median)
  for form in extracted downloads parquet wds hf-tars kaggle-zip tree-tar blurred tfds tpu-tfrecord; do
    m=$(grep "\"$form\"" "$out/layouts.jsonl" | field images_per_s | median)
    c=$(grep "\"$form\"" "$out/layouts.jsonl" | field images_per_cpu_s | median)
    printf '%-10s median %8.1f images/s (wall)  %8.1f images per CPU-second  %5.2fx extracted\n' \
      "$form" "$m" "$c" "$(echo "$m / $base" | bc -l)"
  done
fi

if [[ " $sections " == *" gzip "* ]]; then
  # ImageNet-22k as image-net.org ships it (winter21_whole.tar.gz: a gzip-compressed outer tar
  # of per-synset tars), made of the layouts' train tar: ddl-pack reading the .tar.gz, against
  # gunzip to disk then ddl-pack on the .tar (what a user does without it), and the .tar alone.
  ensure_forms
  gzdir=$out/gzip
  if [ ! -f "$gzdir/.done" ]; then
    rm -rf "$gzdir" && mkdir -p "$gzdir/plain" "$gzdir/gz"
    ln "$forms/downloads/ILSVRC2012_img_train.tar" "$gzdir/plain/winter21_whole.tar"
    gzip -6 -c "$gzdir/plain/winter21_whole.tar" > "$gzdir/gz/winter21_whole.tar.gz"
    touch "$gzdir/.done"
  fi
  flags=(--shards 8 --max-short-side 256 --quality 90 --val-fraction 0.02)
  echo "== gzip: ddl-pack from winter21_whole.tar.gz, gunzip + ddl-pack, the .tar ($ntrain images, $runs runs)"
  : > "$out/gzip.jsonl"
  for r in $(seq "$runs"); do
    rm -rf "$out"/shards-gz*
    timed "$out/gzip.jsonl" "{\"peer\": \"tar.gz\", \"images\": $ntrain}" \
      "$bin/ddl-pack" "$gzdir/gz/winter21_whole.tar.gz" -o "$out/shards-gz1" "${flags[@]}"
    timed "$out/gzip.jsonl" "{\"peer\": \"gunzip+tar\", \"images\": $ntrain}" bash -c \
      'mkdir -p "$1" && gzip -dc "$2" > "$1/winter21_whole.tar" && "${@:3}" "$1/winter21_whole.tar"; s=$?; rm -rf "$1"; exit $s' \
      _ "$out/gunzipped" "$gzdir/gz/winter21_whole.tar.gz" "$bin/ddl-pack" -o "$out/shards-gz2" "${flags[@]}"
    timed "$out/gzip.jsonl" "{\"peer\": \"tar\", \"images\": $ntrain}" \
      "$bin/ddl-pack" "$gzdir/plain/winter21_whole.tar" -o "$out/shards-gz3" "${flags[@]}"
  done
  for p in tar.gz gunzip+tar tar; do
    m=$(grep "\"$p\"" "$out/gzip.jsonl" | field wall_s | median)
    c=$(grep "\"$p\"" "$out/gzip.jsonl" | field cpu_s | median)
    printf '%-11s median %7.2f s (wall)  %7.2f CPU-seconds\n' "$p" "$m" "$c"
  done
fi

if [[ " $sections " == *" loader "* ]]; then
  echo "== loader: RandomResizedCrop 224 + flip + normalize, float32, batch 64, $(nproc) workers"
  [ -f "$out/shards/manifest.json" ] || "$bin/ddl-pack" "$tree" -o "$out/shards" --shards 8 --max-short-side 256 2>/dev/null
  if have_ffcv && [ ! -f "$out/ffcv.beton" ]; then
    .venv-ffcv/bin/python tools/bench/ffcv_write.py "$tree" "$out/ffcv.beton" --max-res 340 --workers "$(nproc)" >/dev/null
  fi
  : > "$out/loader.jsonl"
  for r in $(seq "$runs"); do
    "$bin/examples/loader_bench" "$out/shards" 15 "$(nproc)" 64 --mode region --size 224 \
      | sed -n 's/^pipeline Region: \([0-9.]*\) images\/s (\([0-9.]*\) ms CPU per image.*/{"peer": "ddl-loader", "images_per_s": \1, "cpu_ms_per_image": \2}/p' \
      | python3 -c 'import json,sys; [print(json.dumps({**r, "images_per_cpu_s": 1e3 / r["cpu_ms_per_image"]})) for r in map(json.loads, sys.stdin)]' \
      >> "$out/loader.jsonl"
    .venv-bench/bin/python tools/bench/torchvision_loader.py "$tree" --workers "$(nproc)" --batch 64 --passes 1 >> "$out/loader.jsonl"
    if have_ffcv; then
      .venv-ffcv/bin/python tools/bench/ffcv_load.py "$out/ffcv.beton" --workers "$(nproc)" --batch 64 --passes 2 | grep '"warmup": false' >> "$out/loader.jsonl"
    fi
    .venv-bench/bin/python tools/bench/turbo_decode.py "$out/shards" --procs "$(nproc)" --passes 1 >> "$out/loader.jsonl"
    .venv-bench/bin/python tools/bench/turbo_decode.py "$tree" --procs "$(nproc)" --passes 1 >> "$out/loader.jsonl"
  done
  for p in '"ddl-loader"' '"torchvision"' '"ffcv"' '"shards"' '"original-files"'; do
    rows=$(grep "$p" "$out/loader.jsonl" || true)
    cpu=$(echo "$rows" | python3 -c "import json,sys; [print(round(json.loads(l).get('images_per_cpu_s', float('nan')), 1)) for l in sys.stdin if l.strip()]" | median)
    printf '%-18s median %8.1f images/s (wall)  %8s images per CPU-second\n' "$p" "$(echo "$rows" | field images_per_s | median)" "$cpu"
  done
  echo "(\"shards\" / \"original-files\": libjpeg-turbo full decode of the shard records / of the original JPEGs;"
  echo " images per CPU-second: ddl from getrusage over its run, the decoders from their processes' CPU time)"
fi

if [[ " $sections " == *" allreduce "* ]]; then
  echo "== allreduce: every ddl algorithm vs MPI_Allreduce vs gloo, np 2 and 4"
  tools/bench/allreduce.sh "$out"
fi
if [[ " $sections " == *" python "* ]]; then
  echo "== python: the ddl package (ddl.Loader, ddl.dist) vs the Rust it binds and the PyTorch peers"
  BENCH_BIN="$bin" tools/bench/python.sh "$out"
fi
if [[ " $sections " == *" binding "* ]]; then
  echo "== binding: ddl.Loader and ddl-train, one rank bound to one core vs unbound"
  BENCH_BIN="$bin" tools/bench/binding.sh "$out"
fi
if [[ " $sections " == *" exchange "* ]]; then
  echo "== exchange: top-1 of class-ordered nodes against Q; epoch time of Q 0.25 against Q 0"
  tools/bench/exchange_accuracy.sh "$out/exchange_accuracy.jsonl"
  tools/bench/exchange_cost.sh "$out/exchange_cost.jsonl"
fi
echo "bench: raw results in $out/"
