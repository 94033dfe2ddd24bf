/**
 * A stage's fetch of its share of the model (the header and the stage's tensors), which its node makes
 * from another member or the hub before the stage's worker starts when it lacks it: the few words the
 * instance card puts on the stage, and the transfers the mesh draws on a link while a stage fetches its
 * share from a member.
 */
import type { InstanceInfo, StageFetch, StageStatus } from '../api/types';
import { formatByteRate, formatBytes, formatPercent } from '../format';
import { shortFileName, type EdgeCopy } from './copies';

/** How far a fetch is, 0..1, or null while its size is unknown. */
export function fetchFraction(fetch: StageFetch): number | null {
  if (fetch.done) return 1;
  return fetch.bytes_total > 0 ? Math.min(1, fetch.bytes_done / fetch.bytes_total) : null;
}

/** "45 % · 120 MB/s": how far, and the rate once there is one (empty before either is known). */
export function fetchProgress(fetch: StageFetch): string {
  const fraction = fetchFraction(fetch);
  const parts = [fraction === null ? '' : formatPercent(fraction), fetch.bytes_per_second > 0 ? formatByteRate(fetch.bytes_per_second) : ''];
  return parts.filter((p) => p !== '').join(' · ');
}

/** The fetch a stage is making now: null when it is not fetching (a fetch that broke off stays undone). */
export function runningFetch(stage: StageStatus): StageFetch | null {
  return stage.state === 'fetching' && stage.fetch !== null && !stage.fetch.done ? stage.fetch : null;
}

/**
 * What the instance card says of a stage's fetch: "fetching its share from beta · 45 % · 120 MB/s"
 * while it runs, "share fetched from beta (54.0 MB)" once done; null without one, or for one that
 * broke off (the stage's error tells why).
 */
export function stageFetchText(stage: StageStatus): string | null {
  const fetch = stage.fetch;
  if (fetch === null) return null;
  if (fetch.done) return `share fetched from ${fetch.from} (${formatBytes(fetch.bytes_fetched)})`;
  if (runningFetch(stage) === null) return null;
  const progress = fetchProgress(fetch);
  return `fetching its share from ${fetch.from}${progress === '' ? '' : ` · ${progress}`}`;
}

/**
 * The stages fetching their share from a member (not the hub), as transfers on the link from that
 * member to the stage's node: "fetching share of SmolLM2… 45 % · 120 MB/s", titled "gamma fetching its
 * share of SmolLM2-135M-Instruct.Q4_1 from beta · 45 % · 120 MB/s".
 */
export function fetchEdges(instances: readonly InstanceInfo[]): EdgeCopy[] {
  return instances.flatMap((instance) =>
    instance.stages.flatMap((stage, i): EdgeCopy[] => {
      const fetch = runningFetch(stage);
      if (fetch === null || fetch.from_node === null) return [];
      const progress = fetchProgress(fetch);
      return [
        {
          id: `fetch:${instance.id}:${i}`,
          kind: 'fetch',
          from: fetch.from_node,
          to: stage.node,
          state: 'copying',
          fraction: fetchFraction(fetch),
          label: `fetching share of ${shortFileName(instance.model)}${progress === '' ? '' : ` ${progress}`}`,
          title: `${stage.node_name} fetching its share of ${instance.model} from ${fetch.from}${progress === '' ? '' : ` · ${progress}`}`,
        },
      ];
    }),
  );
}
