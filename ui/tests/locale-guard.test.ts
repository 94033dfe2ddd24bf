import { describe, expect, it } from 'vitest';
import { usableLanguage } from '../src/lib/locale-guard';

describe('usableLanguage', () => {
  it('keeps valid tags', () => {
    expect(usableLanguage('de-CH')).toBe('de-CH');
  });
  it('turns POSIX locales into tags or the default', () => {
    expect(usableLanguage('C')).toBe('en-US');
    expect(usableLanguage('POSIX')).toBe('en-US');
    expect(usableLanguage('fr_FR.UTF-8')).toBe('fr-FR');
    expect(usableLanguage(undefined)).toBe('en-US');
  });
});
