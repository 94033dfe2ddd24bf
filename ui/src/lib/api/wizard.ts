/**
 * The RDMA setup wizard of the node that serves the page (`GET /api/rdma/wizard`, and `POST` with an
 * action); its types come from src/rdma/wizard.rs and src/rdma/fixes.rs through ./generated.ts. Nodes
 * built before the wizard answer 404: the Setup view then shows the doctor alone.
 */
export type {
  DoctorSummary,
  Fix,
  FixId,
  FixOutcome,
  Verification,
  VerifyResult,
  WizardAction,
  WizardResponse,
  WizardState,
  WizardStep,
  WizardStepId,
  WizardView,
} from './generated';

/** A paragraph split into plain text and `code` spans (the wizard marks commands with backticks). */
export function codeSpans(text: string): { code: boolean; text: string }[] {
  return text.split('`').map((part, i) => ({ code: i % 2 === 1, text: part })).filter((p) => p.text !== '');
}
