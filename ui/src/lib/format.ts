/** Numbers as people read them: bytes, byte and bit rates, counts, latencies, token rates, time left. */

const BYTE_UNITS = ['B', 'KB', 'MB', 'GB', 'TB'];

/** Decimal units (what the node's own messages and `--memory-limit 64MB` use). */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return '—';
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < BYTE_UNITS.length - 1) {
    value /= 1000;
    unit++;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${BYTE_UNITS[unit]}`;
}

/** A download rate: "4.20 MB/s". */
export function formatByteRate(bytesPerSecond: number | null): string {
  if (bytesPerSecond === null || !Number.isFinite(bytesPerSecond) || bytesPerSecond < 0) return '—';
  return `${formatBytes(bytesPerSecond)}/s`;
}

/** A large count, as model sizes are said: "135 M", "7.6 B". */
export function formatCount(count: number | null): string {
  if (count === null || !Number.isFinite(count) || count < 0) return '—';
  const units: [number, string][] = [
    [1e12, 'T'],
    [1e9, 'B'],
    [1e6, 'M'],
    [1e3, 'K'],
  ];
  for (const [size, unit] of units) {
    if (count >= size) {
      const value = count / size;
      return `${value >= 100 ? value.toFixed(0) : value.toFixed(1).replace(/\.0$/, '')} ${unit}`;
    }
  }
  return `${Math.round(count)}`;
}

/** Time left, to the second under a minute: "42 s", "3 min 5 s", "1 h 12 min". */
export function formatDuration(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds) || seconds < 0) return '—';
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 === 0 ? '' : ` ${s % 60} s`}`;
  const minutes = Math.round(s / 60);
  return `${Math.floor(minutes / 60)} h${minutes % 60 === 0 ? '' : ` ${minutes % 60} min`}`;
}

/** How long something took, to the tenth under ten seconds: "0.35 s", "4.2 s", "1 min 5 s". */
export function formatSeconds(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds) || seconds < 0) return '—';
  if (seconds < 1) return `${seconds.toFixed(2)} s`;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  return formatDuration(seconds);
}

export function formatBitRate(bps: number | null): string {
  if (bps === null || !Number.isFinite(bps)) return '—';
  if (bps >= 1e9) return `${(bps / 1e9).toFixed(bps >= 1e11 ? 0 : 1)} Gb/s`;
  if (bps >= 1e6) return `${(bps / 1e6).toFixed(0)} Mb/s`;
  return `${(bps / 1e3).toFixed(0)} kb/s`;
}

export function formatMicros(us: number | null): string {
  if (us === null || !Number.isFinite(us)) return '—';
  if (us >= 1_000_000) return `${(us / 1_000_000).toFixed(2)} s`;
  if (us >= 1_000) return `${(us / 1_000).toFixed(us >= 10_000 ? 0 : 1)} ms`;
  return `${Math.round(us)} µs`;
}

export function formatMillis(ms: number | null): string {
  return ms === null ? '—' : formatMicros(ms * 1000);
}

export function formatTokenRate(perSecond: number | null): string {
  if (perSecond === null || !Number.isFinite(perSecond)) return '—';
  return `${perSecond >= 100 ? perSecond.toFixed(0) : perSecond.toFixed(1)} tok/s`;
}

export function formatPercent(fraction: number): string {
  return `${Math.round(fraction * 100)} %`;
}

/** "4:59" until `atMs`, or "expired". */
export function formatCountdown(atMs: number, nowMs: number): string {
  const left = Math.max(0, Math.round((atMs - nowMs) / 1000));
  if (left === 0) return 'expired';
  return `${Math.floor(left / 60)}:${String(left % 60).padStart(2, '0')}`;
}

/** Inclusive layer numbers of a half-open range: "0–9". */
export function formatLayers(range: { start: number; end: number }): string {
  return range.end - range.start <= 1 ? `${range.start}` : `${range.start}–${range.end - 1}`;
}

/**
 * What a tensor-parallel rank holds of every layer: "heads 0–5 · ffn 0–767", with its experts when the
 * model has them.
 */
export function formatSlice(slice: {
  query_heads: { start: number; end: number };
  feed_forward: { start: number; end: number };
  experts: { start: number; end: number };
}): string {
  const parts = [`heads ${formatLayers(slice.query_heads)}`];
  if (slice.feed_forward.end > slice.feed_forward.start) parts.push(`ffn ${formatLayers(slice.feed_forward)}`);
  if (slice.experts.end > slice.experts.start) parts.push(`experts ${formatLayers(slice.experts)}`);
  return parts.join(' · ');
}

/**
 * What a stage holds: its layers; a tensor-parallel rank's slice of every layer; in a chain of groups, a
 * rank's slice of its group's layers ("10–19 · heads 0–4 · ffn 0–767").
 */
export function formatHolds(
  stage: { layers: { start: number; end: number }; slice: Parameters<typeof formatSlice>[0] | null },
  parallel: 'pipeline' | 'tensor' | 'chain',
): string {
  if (stage.slice === null) return formatLayers(stage.layers);
  return parallel === 'chain' ? `${formatLayers(stage.layers)} · ${formatSlice(stage.slice)}` : formatSlice(stage.slice);
}

/** A way to split a model, as a sentence names it: "a pipeline", "tensor parallel", "a chain of groups". */
export function formatParallel(parallel: 'pipeline' | 'tensor' | 'chain'): string {
  return parallel === 'tensor' ? 'tensor parallel' : parallel === 'chain' ? 'a chain of groups' : 'a pipeline';
}

export function formatClock(ms: number): string {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

export function shortId(id: string): string {
  return id.replaceAll('-', '').slice(0, 8);
}
