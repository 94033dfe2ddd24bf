/**
 * The RDMA setup wizard of the node that serves the page (`GET /api/rdma/wizard`, and `POST` with an
 * action), mirrored from src/rdma/wizard.rs and src/rdma/fixes.rs. Nodes built before the wizard answer
 * 404: the Setup view then shows the doctor alone.
 */
import type { Check } from './types';

export type WizardStepId = 'why' | 'prerequisites' | 'what_happens' | 'recovery' | 'waiting_for_reboot' | 'verify';
export type FixId = 'thunderbolt_bridge' | 'link_local_ipv4';

export type FixOutcome =
  | { status: 'applied'; fix: FixId; commands: string[] }
  | { status: 'cancelled'; fix: FixId; commands: string[] }
  | { status: 'failed'; fix: FixId; error: string; commands: string[] }
  | { status: 'show_only'; fix: FixId; reason: string; commands: string[] };

export interface WizardState {
  started: boolean;
  step: WizardStepId;
  boot_time_at_wait: number | null;
  rebooted: boolean;
  fixes: FixOutcome[];
  updated_at_ms: number;
}

export interface WizardStep {
  id: WizardStepId;
  title: string;
  body: string[];
  /** Commands the step asks the user to type (shown for copying). */
  commands?: string[];
  status: 'done' | 'current' | 'upcoming';
}

export interface DoctorSummary {
  platform: string;
  rdma_enabled: boolean | null;
  usable_interfaces: string[];
  passed: number;
  failed: number;
  unknown: number;
  checks: Check[];
}

export interface Fix {
  id: FixId;
  title: string;
  explanation: string;
  commands: string[];
  /** shoal can run it here, behind the administrator prompt (macOS). */
  can_apply: boolean;
}

export type VerifyResult = 'enabled_and_healthy' | 'still_disabled' | 'other_failures' | 'not_a_mac';

export interface Verification {
  result: VerifyResult;
  message: string;
  failures: Check[];
}

export interface WizardView {
  state: WizardState;
  steps: WizardStep[];
  doctor: DoctorSummary;
  fixes: Fix[];
  verification: Verification | null;
  /** What became of the fix just asked for (POST only). */
  outcome?: FixOutcome;
}

export type WizardAction =
  | { action: 'start' }
  | { action: 'next' }
  | { action: 'back' }
  | { action: 'reset' }
  | { action: 'apply_fix'; fix: FixId };

/** A paragraph split into plain text and `code` spans (the wizard marks commands with backticks). */
export function codeSpans(text: string): { code: boolean; text: string }[] {
  return text.split('`').map((part, i) => ({ code: i % 2 === 1, text: part })).filter((p) => p.text !== '');
}
