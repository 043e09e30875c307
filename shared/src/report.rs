//! An error and its causes in one line, for the binaries' last words.

use std::error::Error;

/// `error` and each of its sources joined by `: `, leaving out a source whose text the line
/// already ends with (an error that prints its source as part of its own message) and sources
/// that print nothing (a transparent wrapper's), so every cause shows once and no part is empty.
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(error);
    while let Some(error) = next {
        let text = error.to_string();
        let text = text.trim();
        if !text.is_empty() && !line.ends_with(text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text.replace('\n', " "));
        }
        next = error.source();
    }
    if line.is_empty() {
        // Nothing printed anything: the type is the only clue left.
        line = format!("{error:?}");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading /etc/secret/cloudprovider/aws_access_key_id: {0}")]
    struct Read(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    enum Setup {
        #[error(transparent)]
        Read(#[from] Read),
        #[error("")]
        Empty(#[source] std::io::Error),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("kubeconfig")]
    struct Outer(#[source] Setup);

    fn io(text: &str) -> std::io::Error {
        std::io::Error::other(text.to_owned())
    }

    #[test]
    fn every_cause_shows_once_and_no_part_is_empty() {
        let read = Setup::Read(Read(io("permission denied")));
        assert_eq!(
            one_line(&read),
            "reading /etc/secret/cloudprovider/aws_access_key_id: permission denied"
        );
        let empty = Outer(Setup::Empty(io("connection refused")));
        assert_eq!(one_line(&empty), "kubeconfig: connection refused");
        let multi = io("line one\nline two");
        assert_eq!(one_line(&multi), "line one line two");
        let nothing = io("");
        assert!(!one_line(&nothing).is_empty());
    }
}
