//! The private IP of an Elastic IP's association, which moto does not keep: it ignores
//! `AssociateAddress`'s `PrivateIpAddress` and reports the ENI's primary address instead. Real
//! EC2 associates the Elastic IP with the private IP asked for and `DescribeAddresses` names it
//! (`privateIpAddress`, API_Address), so a reconciler that recognises its own association by
//! interface and private IP can only be tested for that with the answer corrected. The proxy
//! notes the private IP of each association it saw made (by the association id moto answers) and
//! writes it into the `DescribeAddresses` answers that show that association.
//!
//! A text edit, not an XML rewrite: moto's serializer writes each address's members in the
//! order of EC2's `Address` shape, `associationId` before `privateIpAddress`, both before the
//! address's own `tagSet` (whose `item`s come after them), so the first `</item>` after an
//! `associationId` closes that address.

use std::collections::BTreeMap;

/// Association id → the private IP it was made with.
#[derive(Debug, Default)]
pub(crate) struct Associations(BTreeMap<String, String>);

impl Associations {
    /// Notes an `AssociateAddress` with these form parameters that EC2 answered with `answer`.
    pub(crate) fn made<'a>(
        &mut self,
        params: impl Iterator<Item = (&'a str, &'a str)>,
        answer: &str,
    ) {
        let Some(private_ip) = params
            .filter(|(key, _)| *key == "PrivateIpAddress")
            .map(|(_, value)| value.to_owned())
            .last()
        else {
            return;
        };
        if let Some(id) = between(answer, "<associationId>", "</associationId>") {
            self.0.insert(id.to_owned(), private_ip);
        }
    }

    /// `answer` (a `DescribeAddresses` answer) with each noted association's private IP in
    /// place of moto's; `None` when it changes nothing.
    pub(crate) fn rewrite(&self, answer: &str) -> Option<String> {
        let mut text = answer.to_owned();
        let mut changed = false;
        for (id, private_ip) in &self.0 {
            let marker = format!("<associationId>{id}</associationId>");
            let Some(at) = text.find(&marker) else {
                continue;
            };
            let rest = &text[at..];
            let Some(item_end) = rest.find("</item>") else {
                continue;
            };
            let open = "<privateIpAddress>";
            let close = "</privateIpAddress>";
            let (start, end) = match (rest.find(open), rest.find(close)) {
                (Some(start), Some(end)) if end < item_end && start < end => {
                    (at + start + open.len(), at + end)
                }
                _ => {
                    // No private IP written: add it at the end of the address.
                    let member = format!("{open}{private_ip}{close}");
                    text.insert_str(at + item_end, &member);
                    changed = true;
                    continue;
                }
            };
            if text[start..end] != **private_ip {
                text.replace_range(start..end, private_ip);
                changed = true;
            }
        }
        changed.then_some(text)
    }
}

/// The text between the first `open` and the `close` after it.
fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let len = text[start..].find(close)?;
    Some(&text[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBED: &str = "<DescribeAddressesResponse><addressesSet>\
        <item><publicIp>198.51.100.1</publicIp><allocationId>eipalloc-1</allocationId>\
        <associationId>eipassoc-1</associationId><networkInterfaceId>eni-1</networkInterfaceId>\
        <privateIpAddress>10.0.0.10</privateIpAddress>\
        <tagSet><item><key>k</key><value>v</value></item></tagSet></item>\
        <item><publicIp>198.51.100.2</publicIp><allocationId>eipalloc-2</allocationId>\
        <associationId>eipassoc-2</associationId><networkInterfaceId>eni-2</networkInterfaceId>\
        </item></addressesSet></DescribeAddressesResponse>";

    #[test]
    fn a_noted_association_shows_the_private_ip_it_was_made_with() {
        let mut associations = Associations::default();
        associations.made(
            [("AllocationId", "eipalloc-1"), ("PrivateIpAddress", "10.0.0.40")].into_iter(),
            "<AssociateAddressResponse><associationId>eipassoc-1</associationId></AssociateAddressResponse>",
        );
        associations.made(
            [("PrivateIpAddress", "10.0.0.41")].into_iter(),
            "<AssociateAddressResponse><associationId>eipassoc-2</associationId></AssociateAddressResponse>",
        );
        let edited = associations.rewrite(DESCRIBED).unwrap_or_default();
        assert!(
            edited.contains("<associationId>eipassoc-1</associationId><networkInterfaceId>eni-1</networkInterfaceId><privateIpAddress>10.0.0.40</privateIpAddress>"),
            "{edited}"
        );
        assert!(
            edited.contains("<privateIpAddress>10.0.0.41</privateIpAddress></item></addressesSet>"),
            "{edited}"
        );
        assert!(!edited.contains("10.0.0.10"), "{edited}");
        assert!(
            associations.rewrite(&edited).is_none(),
            "nothing left to change"
        );
        assert!(Associations::default().rewrite(DESCRIBED).is_none());
    }
}
