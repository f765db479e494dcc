"""The CPU copy path: a batched memcpy in C, built on first use, called through ctypes.

Why C: torch's ``index_select``/``index_copy_`` move one row per loop iteration with
per-element indexing and need a temporary for gather-then-scatter; on this project's
machines they run 5-10x below memcpy for KV rows. A batch here is a flat list of
``(src address, dst address, nbytes)`` pieces (one per layer, family and id pair, each at
least one unit of one layer); the C loop hands them to ``memcpy`` across a few threads,
taking ~1 MiB chunks of consecutive pieces from a shared counter (a preempted thread
delays one chunk, not half the batch); pieces of large batches are written with
non-temporal (streaming) stores, as a large memcpy does. ctypes releases the
GIL for the call, so the controller's worker thread copies while Python keeps scheduling.

The library is a few dozen lines with no Python or torch headers, so it compiles in well
under a second with the system C compiler (the same one Triton needs). It is cached under
``$HICACHE_CACHE_DIR`` (default ``~/.cache/hicache``) keyed by a hash of the source.
Without a compiler (or with ``HICACHE_NATIVE=0``) :func:`load` returns None and callers
fall back to the torch path; :func:`status` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <pthread.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define HC_X86 1
#endif

/* Streaming (non-temporal) copy: stores bypass the cache, so the destination's lines are
   never read first (a plain memcpy of a 37 KB piece reads the destination too: 3 bytes of
   traffic per byte copied instead of 2). Large contiguous memcpy does this internally;
   scattered pieces are each too small for glibc to choose it, so we do. */
#ifdef HC_X86
__attribute__((target("avx2")))
static void hc_stream_avx2(char *d, const char *s, size_t n) {
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head > n) head = n;
    memcpy(d, s, head); d += head; s += head; n -= head;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    memcpy(d + i, s + i, n - i);
}

static void hc_stream_sse2(char *d, const char *s, size_t n) {
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head); d += head; s += head; n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
}
#endif

enum { HC_STREAM_MIN = 1024 };  /* below this a piece is all head and tail */

/* Work is cut into chunks of consecutive pieces (about HC_CHUNK bytes each) that threads
   take from a shared counter: a thread the OS preempts delays only its current chunk,
   not a fixed half of the batch. */
enum { HC_CHUNK = 1 << 20, HC_MAXT = 64 };

typedef struct {
    const int64_t *src, *dst, *len, *cuts;
    int64_t nchunks;
    int64_t next;  /* shared: next chunk to take */
    int stream;
} hc_batch;

static void hc_copy_range(const hc_batch *b, int64_t lo, int64_t hi) {
#ifdef HC_X86
    int avx2 = __builtin_cpu_supports("avx2");
#endif
    for (int64_t i = lo; i < hi; i++) {
        /* Touch the next piece's first line early: pieces are scattered, so the hardware
           prefetcher cannot guess where the next one starts. */
        if (i + 1 < hi) __builtin_prefetch((const void *)b->src[i + 1], 0, 0);
        char *d = (char *)b->dst[i];
        const char *s = (const char *)b->src[i];
        size_t n = (size_t)b->len[i];
#ifdef HC_X86
        if (b->stream && n >= HC_STREAM_MIN) {
            if (avx2) hc_stream_avx2(d, s, n); else hc_stream_sse2(d, s, n);
            continue;
        }
#endif
        memcpy(d, s, n);
    }
}

static void *hc_worker(void *arg) {
    hc_batch *b = (hc_batch *)arg;
    for (;;) {
        int64_t c = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (c >= b->nchunks) break;
        hc_copy_range(b, b->cuts[c], b->cuts[c + 1]);
    }
#ifdef HC_X86
    if (b->stream) _mm_sfence();  /* streaming stores are weakly ordered: publish them */
#endif
    return 0;
}

/* Copy count pieces src[i] -> dst[i] of len[i] bytes on up to nthreads threads (the
   caller's thread is one of them). stream != 0 uses non-temporal stores for pieces of at
   least HC_STREAM_MIN bytes (x86-64; elsewhere plain memcpy). Returns 0, -1 if a thread
   could not be started (the others, and the caller, then do its share: nothing is
   skipped), or -2 if the chunk table could not be allocated (copied on one thread). */
int hc_copy_pieces(const int64_t *src, const int64_t *dst, const int64_t *len,
                   int64_t count, int nthreads, int stream) {
    if (nthreads < 1) nthreads = 1;
    if (nthreads > HC_MAXT) nthreads = HC_MAXT;
    int64_t total = 0;
    for (int64_t i = 0; i < count; i++) total += len[i];
    int64_t want = total / HC_CHUNK + 1;
    if (want < 4 * (int64_t)nthreads) want = 4 * (int64_t)nthreads;
    if (want > count) want = count;
    int64_t *cuts = (int64_t *)malloc(sizeof(int64_t) * (size_t)(want + 1));
    hc_batch b = {src, dst, len, cuts, 0, 0, stream};
    if (!cuts) { b.cuts = 0; hc_copy_range(&b, 0, count); return -2; }
    /* cut where the running byte count crosses each multiple of total / want */
    int64_t acc = 0, c = 0;
    cuts[0] = 0;
    for (int64_t i = 0; i < count && c + 1 < want; i++) {
        acc += len[i];
        if (acc >= total / want * (c + 1)) cuts[++c] = i + 1;
    }
    if (cuts[c] != count) cuts[++c] = count;
    b.nchunks = c;
    pthread_t th[HC_MAXT];
    int started[HC_MAXT] = {0}, rc = 0;
    for (int t = 1; t < nthreads && t < b.nchunks; t++) {
        if (pthread_create(&th[t], 0, hc_worker, &b) == 0) started[t] = 1;
        else rc = -1;
    }
    hc_worker(&b);
    for (int t = 1; t < nthreads; t++) if (started[t]) pthread_join(th[t], 0);
    free(cuts);
    return rc;
}

int hc_abi_version(void) { return 3; }
"""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status: str | None = None


def _cache_dir() -> Path:
    root = os.environ.get("HICACHE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hicache"


def _build(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "hc_copy.c"
        out = Path(tmp) / target.name
        src.write_text(C_SOURCE)
        proc = subprocess.run([cc, "-O3", "-shared", "-fPIC", "-pthread", str(src), "-o", str(out)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(out, target)  # atomic: concurrent builders never load a half-written file


def load() -> ctypes.CDLL | None:
    """The compiled library, building it on first use; None when it cannot be built."""
    global _lib, _status
    with _lock:
        if _lib is not None or _status is not None:
            return _lib
        if os.environ.get("HICACHE_NATIVE", "1") == "0":
            _status = "disabled by HICACHE_NATIVE=0"
            return None
        digest = hashlib.sha256((C_SOURCE + platform.machine()).encode()).hexdigest()[:16]
        target = _cache_dir() / f"hc_copy_{digest}.so"
        try:
            if not target.is_file():
                _build(target)
            lib = ctypes.CDLL(str(target))
            lib.hc_copy_pieces.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int, ctypes.c_int]
            lib.hc_copy_pieces.restype = ctypes.c_int
            assert lib.hc_abi_version() == 3, "stale native library in the cache"
        except (OSError, RuntimeError, subprocess.SubprocessError, AssertionError) as exc:
            _status = f"unavailable: {exc}"
            return None
        _lib, _status = lib, f"ok ({target})"
        return _lib


def status() -> str:
    """``ok (path)``, ``unavailable: reason`` or ``disabled ...`` (builds if not tried yet)."""
    load()
    assert _status is not None
    return _status


def copy_pieces(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, threads: int, *,
                stream: bool = False) -> None:
    """``memcpy(dst[i], src[i], nbytes[i])`` for every i, on up to ``threads`` threads.

    ``stream=True`` writes pieces of 1 KiB and more with non-temporal stores: right for
    batches far larger than the caches, whose destination is not read again soon.

    The arrays are int64 addresses and lengths; the caller guarantees every range lies
    inside a live tensor it holds a reference to (see :func:`build_pieces`).
    """
    lib = load()
    assert lib is not None, "copy_pieces called without the native library"
    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    nbytes = np.ascontiguousarray(nbytes, dtype=np.int64)
    assert src.shape == dst.shape == nbytes.shape, "piece arrays differ in length"
    if src.size == 0:
        return
    lib.hc_copy_pieces(src.ctypes.data, dst.ctypes.data, nbytes.ctypes.data, src.size, int(threads),
                       int(stream))
