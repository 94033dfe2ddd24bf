//! Stop strings in streamed text: text that might be the start of a stop string is held back until it
//! is known not to be, so a client never sees part of a stop string.

#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
    /// The stop string that ended generation, once one did.
    matched: Option<String>,
}

impl StopStrings {
    pub fn new(stops: &[String]) -> StopStrings {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Adds generated text. Returns the text that can be shown now and whether a stop string was met
    /// (the stop string itself and anything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some((at, stop)) = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s))).min() {
            let shown = self.held[..at].to_string();
            self.matched = Some(stop.clone());
            self.held.clear();
            return (shown, true);
        }
        let keep = self.partial_suffix();
        let shown = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (shown, false)
    }

    /// The stop string that ended generation (None while none has, or when it ended otherwise).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Releases held text at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that begins some stop string.
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        (1..=held.len())
            .rev()
            .filter(|&n| held.is_char_boundary(held.len() - n))
            .find(|&n| {
                let tail = &held[held.len() - n..];
                self.stops.iter().any(|s| s.len() > n && s.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::StopStrings;

    #[test]
    fn stop_string_split_across_pieces_is_never_shown() {
        let mut s = StopStrings::new(&["<end>".to_string()]);
        assert_eq!(s.push("Hello <"), ("Hello ".to_string(), false));
        assert_eq!(s.push("en"), (String::new(), false));
        assert_eq!(s.push("d> more"), (String::new(), true));
        assert_eq!(s.matched(), Some("<end>"));
    }

    #[test]
    fn a_false_start_is_released() {
        let mut s = StopStrings::new(&["\n\n".to_string()]);
        assert_eq!(s.push("a\n"), ("a".to_string(), false));
        assert_eq!(s.push("b"), ("\nb".to_string(), false));
        assert_eq!(s.push("é\n"), ("é".to_string(), false));
        assert_eq!(s.finish(), "\n");
    }
}
