//! Decoding of URL query strings and `application/x-www-form-urlencoded` bodies, for the fakes
//! that read them (the GCE fake's query parameters, the ARM fake's token requests).

/// The `key=value` pairs of a query string or form body, percent-decoded (`+` is a space).
pub fn pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// The first value of `name` in `query`.
pub fn value(query: &str, name: &str) -> Option<String> {
    pairs(Some(query))
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_decoded() {
        let pairs = pairs(Some("%24alt=json&networkInterface=nic0&%24apiVersion=v1"));
        assert_eq!(pairs[0], ("$alt".into(), "json".into()));
        assert_eq!(pairs[2], ("$apiVersion".into(), "v1".into()));
        assert_eq!(
            value(
                "grant_type=client_credentials&scope=http%3A%2F%2F127.0.0.1%3A80%2F.default",
                "scope"
            )
            .as_deref(),
            Some("http://127.0.0.1:80/.default")
        );
    }
}
