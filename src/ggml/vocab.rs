//! llama.cpp's tokenizer, loaded from a GGUF file without its weights ("vocab only"), so every
//! tokenizer type (BPE, SentencePiece, WordPiece, …) and pre-tokenizer behaves exactly as in llama.cpp.

use super::sys;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

#[derive(Debug, thiserror::Error)]
pub enum VocabError {
    #[error("llama.cpp could not read the tokenizer of {path}: the file is damaged or uses a tokenizer this build does not know (see the log above)")]
    Load { path: PathBuf },
    #[error("the path {0} cannot be passed to llama.cpp (it contains a NUL byte)")]
    BadPath(PathBuf),
    #[error("the text is too long to tokenize ({0} bytes)")]
    TooLong(usize),
}

/// A loaded vocabulary. Tokenizing is thread-safe in llama.cpp, so a `Vocab` can be shared.
pub struct Vocab {
    model: NonNull<sys::llama_model>,
    vocab: NonNull<sys::llama_vocab>,
}

// SAFETY: llama.cpp documents tokenization and detokenization as thread-safe; the model is immutable
// after loading and freed only on drop.
unsafe impl Send for Vocab {}
unsafe impl Sync for Vocab {}

impl Drop for Vocab {
    fn drop(&mut self) {
        // SAFETY: the model was loaded by `Vocab::load` and is freed once; the vocab lives inside it.
        unsafe { sys::llama_model_free(self.model.as_ptr()) };
    }
}

impl Vocab {
    /// Loads only the tokenizer of the GGUF file at `path`. The caller should have validated the file's
    /// structure first: llama.cpp's parser trusts some of it.
    pub fn load(path: &Path) -> Result<Vocab, VocabError> {
        super::init();
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| VocabError::BadPath(path.into()))?;
        // SAFETY: default params are a plain struct; vocab_only skips tensors and back ends.
        let model = unsafe {
            let mut params = sys::llama_model_default_params();
            params.vocab_only = true;
            sys::llama_model_load_from_file(cpath.as_ptr(), params)
        };
        let model = NonNull::new(model).ok_or_else(|| VocabError::Load { path: path.into() })?;
        // SAFETY: a loaded model always has a vocab that lives as long as the model.
        let vocab = unsafe { sys::llama_model_get_vocab(model.as_ptr()) };
        let Some(vocab) = NonNull::new(vocab as *mut sys::llama_vocab) else {
            unsafe { sys::llama_model_free(model.as_ptr()) };
            return Err(VocabError::Load { path: path.into() });
        };
        Ok(Vocab { model, vocab })
    }

    fn raw(&self) -> *const sys::llama_vocab {
        self.vocab.as_ptr()
    }

    /// Number of tokens in the vocabulary.
    pub fn len(&self) -> usize {
        // SAFETY: the vocab is alive.
        unsafe { sys::llama_vocab_n_tokens(self.raw()) as usize }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS where the model asks for them; `parse_special`
    /// turns the text of special tokens (such as `<|im_start|>`) into those tokens.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, VocabError> {
        let len = i32::try_from(text.len()).map_err(|_| VocabError::TooLong(text.len()))?;
        let mut ids: Vec<sys::llama_token> = vec![0; text.len() + 2];
        loop {
            // SAFETY: `text` is valid for `len` bytes; `ids` has room for `ids.len()` tokens.
            let n = unsafe {
                sys::llama_tokenize(
                    self.raw(),
                    text.as_ptr() as *const c_char,
                    len,
                    ids.as_mut_ptr(),
                    ids.len() as i32,
                    add_special,
                    parse_special,
                )
            };
            if n == i32::MIN {
                return Err(VocabError::TooLong(text.len()));
            }
            if n < 0 {
                ids.resize(n.unsigned_abs() as usize, 0);
                continue;
            }
            ids.truncate(n as usize);
            return Ok(ids.into_iter().map(|t| t as u32).collect());
        }
    }

    /// The bytes token `id` stands for (possibly part of a UTF-8 character). With `special`, control
    /// tokens render as their text; without, they render as nothing. Unknown ids give no bytes.
    pub fn piece(&self, id: u32, special: bool, out: &mut Vec<u8>) {
        if id as usize >= self.len() {
            return;
        }
        let write = |buf: &mut [u8]| {
            // SAFETY: `buf` is valid for its length; the id is inside the vocabulary.
            unsafe {
                sys::llama_token_to_piece(
                    self.raw(),
                    id as i32,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                    0,
                    special,
                )
            }
        };
        let mut small = [0u8; 128];
        let n = write(&mut small);
        if n >= 0 {
            out.extend_from_slice(&small[..n as usize]);
            return;
        }
        // A negative result is the size llama.cpp needs.
        let mut big = vec![0u8; n.unsigned_abs() as usize];
        let n = write(&mut big);
        if n > 0 {
            out.extend_from_slice(&big[..n as usize]);
        }
    }

    /// Whether `id` ends generation (EOS, EOT, and the model's other end-of-generation tokens).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        // SAFETY: the vocab is alive; llama.cpp range-checks the id.
        id < self.len() as u32 && unsafe { sys::llama_vocab_is_eog(self.raw(), id as i32) }
    }

    /// The text of every token that `tokenize` with `parse_special` makes out of its text: control tokens
    /// (chat markers such as `<|im_start|>`, EOS) and user-defined ones that look like markup (`<`, `[`
    /// or `|` in them: a vocabulary's added markers, not the whitespace runs some define), as (id, text).
    pub fn markup_tokens(&self) -> Vec<(u32, String)> {
        let mut found = Vec::new();
        for id in 0..self.len() as u32 {
            // SAFETY: the vocab is alive and the id inside it.
            let attr = unsafe { sys::llama_vocab_get_attr(self.raw(), id as i32) };
            let control = attr & sys::LLAMA_TOKEN_ATTR_CONTROL != 0;
            let user_defined = attr & sys::LLAMA_TOKEN_ATTR_USER_DEFINED != 0;
            if !control && !user_defined {
                continue;
            }
            let mut bytes = Vec::new();
            self.piece(id, true, &mut bytes);
            let Ok(text) = String::from_utf8(bytes) else { continue };
            let looks_like_markup = text.contains(['<', '[', '|']);
            if !text.trim().is_empty() && (control || looks_like_markup) {
                found.push((id, text));
            }
        }
        found
    }

    /// Whether `id` is a control token (not text).
    pub fn is_control(&self, id: u32) -> bool {
        // SAFETY: as above.
        id < self.len() as u32 && unsafe { sys::llama_vocab_is_control(self.raw(), id as i32) }
    }

    pub fn bos(&self) -> Option<u32> {
        // SAFETY: the vocab is alive.
        u32::try_from(unsafe { sys::llama_vocab_bos(self.raw()) }).ok()
    }

    pub fn eos(&self) -> Option<u32> {
        // SAFETY: the vocab is alive.
        u32::try_from(unsafe { sys::llama_vocab_eos(self.raw()) }).ok()
    }

    /// Whether the model wants a BOS token at the start of every prompt.
    pub fn adds_bos(&self) -> bool {
        // SAFETY: the vocab is alive.
        unsafe { sys::llama_vocab_get_add_bos(self.raw()) }
    }
}
