//! Short quotes of user-written text for messages and logs.
//!
//! A denial or log line that echoes a field whole lets one request make the webhook hold, send
//! and log megabytes (an object name may be as long as the request body). Every message quotes
//! at most a prefix, and says how long the whole was.

use std::borrow::Cow;

/// Longest text quoted whole; longer text is cut to a prefix.
pub const QUOTE_CHARS: usize = 64;

/// `text` itself when short, else its first [`QUOTE_CHARS`] characters, `…` and its length.
pub fn excerpt(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(QUOTE_CHARS) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

/// `text` cut to at most `max` bytes (at a character boundary), with a note that it was cut.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("… (cut)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole_and_long_text_by_a_prefix() {
        assert_eq!(excerpt("10.0.0.5"), "10.0.0.5");
        let long = ".".repeat(1 << 20);
        let quoted = excerpt(&long);
        assert_eq!(
            quoted,
            format!("{}… (1048576 bytes)", ".".repeat(QUOTE_CHARS))
        );
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        let text = "é".repeat(100);
        assert_eq!(
            excerpt(&text).chars().filter(|c| *c == 'é').count(),
            QUOTE_CHARS
        );
        let cut = bounded(text, 5);
        assert_eq!(cut, "éé… (cut)");
        assert_eq!(bounded("short".into(), 5), "short");
    }
}
