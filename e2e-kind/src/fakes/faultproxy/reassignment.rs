//! EC2's refusal to assign a private IPv4 address that another interface holds, which moto does
//! not reproduce (it assigns the address again, leaving it on both interfaces).
//!
//! Real EC2 answers `AssignPrivateIpAddresses` naming an address already assigned to another
//! network interface with HTTP 400 `InvalidIPAddress.InUse` ("The specified IP address is already
//! in use", <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html>; the
//! message reads `Address <ip> is in use.`), unless the request sets `AllowReassignment=true`, in
//! which case the address moves ("AllowReassignment: Indicates whether to allow an IP address
//! that is already assigned to another network interface or instance to be reassigned to the
//! specified network interface", API_AssignPrivateIpAddresses). The proxy reads which interfaces
//! hold the requested addresses from the upstream's own `DescribeNetworkInterfaces` before it
//! forwards such a request.

use std::collections::{BTreeMap, BTreeSet};

use xmlparser::{ElementEnd, Token, Tokenizer};

use super::termination::Refusal;

/// What an `AssignPrivateIpAddresses` request asks for, from its form parameters.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AssignRequest {
    /// The interface the addresses are to be assigned to.
    pub eni: String,
    /// The addresses named (`PrivateIpAddress.N`).
    pub addresses: BTreeSet<String>,
    /// `AllowReassignment=true`: EC2 moves an address held elsewhere instead of refusing.
    pub allow_reassignment: bool,
}

impl AssignRequest {
    /// The request these form parameters make, if it names addresses and may be refused.
    pub(crate) fn parse<'a>(params: impl Iterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let mut request = Self::default();
        for (key, value) in params {
            match key {
                "NetworkInterfaceId" => request.eni = value.to_owned(),
                "AllowReassignment" => request.allow_reassignment = value == "true",
                _ if key.starts_with("PrivateIpAddress.") => {
                    request.addresses.insert(value.to_owned());
                }
                _ => {}
            }
        }
        (!request.allow_reassignment && !request.addresses.is_empty() && !request.eni.is_empty())
            .then_some(request)
    }

    /// EC2's refusal of this request given which interface holds which addresses, if any.
    pub(crate) fn refusal(&self, holders: &BTreeMap<String, BTreeSet<String>>) -> Option<Refusal> {
        let taken = self.addresses.iter().find(|ip| {
            holders
                .iter()
                .any(|(eni, held)| *eni != self.eni && held.contains(*ip))
        })?;
        Some(Refusal {
            code: "InvalidIPAddress.InUse",
            message: format!("Address {taken} is in use."),
        })
    }
}

/// Every interface in a `DescribeNetworkInterfaces` answer and the private IPv4 addresses it
/// holds (primary and secondary); `None` if the text is not XML the proxy can read.
pub(crate) fn holders(answer: &str) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let mut path: Vec<&str> = Vec::new();
    let mut holders = BTreeMap::new();
    let mut current: Option<String> = None;
    for token in Tokenizer::from(answer) {
        match token.ok()? {
            Token::ElementStart { local, .. } => path.push(local.as_str()),
            Token::ElementEnd { end, .. } => match end {
                ElementEnd::Open => {}
                ElementEnd::Close(..) | ElementEnd::Empty => {
                    path.pop();
                }
            },
            Token::Text { text } => {
                let text = text.as_str().trim();
                match path.as_slice() {
                    [.., "networkInterfaceSet", "item", "networkInterfaceId"] => {
                        current = Some(text.to_owned());
                        holders.entry(text.to_owned()).or_insert_with(BTreeSet::new);
                    }
                    [.., "privateIpAddressesSet", "item", "privateIpAddress"] => {
                        if let Some(eni) = &current {
                            holders
                                .entry(eni.clone())
                                .or_insert_with(BTreeSet::new)
                                .insert(text.to_owned());
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Some(holders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::faultproxy::dialect::form_pairs;

    const ANSWER: &str = r#"<DescribeNetworkInterfacesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
      <networkInterfaceSet>
        <item><networkInterfaceId>eni-a</networkInterfaceId>
          <attachment><instanceId>i-a</instanceId></attachment>
          <privateIpAddress>10.0.0.4</privateIpAddress>
          <privateIpAddressesSet>
            <item><privateIpAddress>10.0.0.4</privateIpAddress><primary>true</primary></item>
            <item><privateIpAddress>10.0.0.9</privateIpAddress><primary>false</primary></item>
          </privateIpAddressesSet>
        </item>
        <item><networkInterfaceId>eni-b</networkInterfaceId>
          <privateIpAddressesSet>
            <item><privateIpAddress>10.0.0.5</privateIpAddress><primary>true</primary></item>
          </privateIpAddressesSet>
        </item>
      </networkInterfaceSet>
    </DescribeNetworkInterfacesResponse>"#;

    fn request(form: &str) -> Option<AssignRequest> {
        AssignRequest::parse(form_pairs(form.as_bytes()))
    }

    #[test]
    fn the_answer_names_each_interface_with_its_addresses() {
        let holders = holders(ANSWER).unwrap();
        assert_eq!(holders.len(), 2);
        assert_eq!(
            holders["eni-a"],
            BTreeSet::from(["10.0.0.4".to_owned(), "10.0.0.9".to_owned()])
        );
        assert_eq!(holders["eni-b"], BTreeSet::from(["10.0.0.5".to_owned()]));
    }

    #[test]
    fn an_address_held_by_another_interface_is_refused_as_ec2_does() {
        let holders = holders(ANSWER).unwrap();
        let taken = request(
            "Action=AssignPrivateIpAddresses&NetworkInterfaceId=eni-b&PrivateIpAddress.1=10.0.0.7\
             &PrivateIpAddress.2=10.0.0.9",
        )
        .unwrap();
        let refusal = taken.refusal(&holders).unwrap();
        assert_eq!(refusal.code, "InvalidIPAddress.InUse");
        assert_eq!(refusal.message, "Address 10.0.0.9 is in use.");
        let own = request("NetworkInterfaceId=eni-a&PrivateIpAddress.1=10.0.0.9").unwrap();
        assert_eq!(own.refusal(&holders), None, "already on the target itself");
        let free = request("NetworkInterfaceId=eni-b&PrivateIpAddress.1=10.0.0.8").unwrap();
        assert_eq!(free.refusal(&holders), None);
    }

    #[test]
    fn reassignment_allowed_or_no_address_named_is_never_refused() {
        let allowed = "NetworkInterfaceId=eni-b&PrivateIpAddress.1=10.0.0.9&AllowReassignment=true";
        assert_eq!(request(allowed), None);
        assert_eq!(
            request("NetworkInterfaceId=eni-b&SecondaryPrivateIpAddressCount=2"),
            None
        );
        let denied = "NetworkInterfaceId=eni-b&PrivateIpAddress.1=10.0.0.9&AllowReassignment=false";
        assert!(request(denied).is_some());
    }
}
