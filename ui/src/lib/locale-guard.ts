/**
 * Makes `navigator.language` a valid BCP 47 tag before anything formats numbers with it. WebKitGTK
 * reports the POSIX locale as is, so under `LANG=C` (services, CI, minimal desktops) it says "C", and
 * `new Intl.NumberFormat("C")` throws — which stops modules (uPlot among them) that format at load time.
 * Imported first by main.ts so it runs before every other module.
 */
export function usableLanguage(language: string | undefined): string {
  if (language === undefined || ['', 'c', 'posix'].includes(language.split('.')[0]?.toLowerCase() ?? '')) return 'en-US';
  try {
    new Intl.NumberFormat(language);
    return language;
  } catch {
    // "en_US.UTF-8" → "en-US"; anything else unusable → the default.
    const tag = language.split('.')[0]?.replace('_', '-') ?? '';
    try {
      new Intl.NumberFormat(tag);
      return tag;
    } catch {
      return 'en-US';
    }
  }
}

const current = globalThis.navigator?.language;
const usable = usableLanguage(current);
if (usable !== current && globalThis.navigator !== undefined) {
  Object.defineProperty(globalThis.navigator, 'language', { value: usable, configurable: true });
  Object.defineProperty(globalThis.navigator, 'languages', { value: [usable], configurable: true });
}
