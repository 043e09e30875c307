//! What EC2 shows of a terminated instance, which moto does not reproduce.
//!
//! Real EC2 deletes a terminated instance's primary ENI (its `DeleteOnTermination` is set), lists
//! the instance as `terminated` with no network interfaces for a while (about an hour), and then
//! forgets it: `DescribeInstances` naming it answers `InvalidInstanceID.NotFound`. Every call
//! naming the deleted ENI answers `InvalidNetworkInterfaceID.NotFound` from the start. moto keeps
//! the ENI, attached and holding its addresses, so the proxy plays EC2's part for the instances a
//! test marks: it refuses requests that name them and edits the `Describe…` answers it forwards.
//! See <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/terminating-instances.html>.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use xmlparser::{ElementEnd, Token, Tokenizer};

/// How EC2 shows an instance after its termination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TerminationPhase {
    /// Listed as `terminated` (code 48) with no network interfaces; its ENIs are gone.
    Listed,
    /// Forgotten: naming it answers `InvalidInstanceID.NotFound`, listings leave it out.
    Gone,
}

/// The error the proxy answers in EC2's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// EC2's error code.
    pub code: &'static str,
    /// EC2's wording.
    pub message: String,
}

#[derive(Debug)]
struct Terminated {
    enis: Vec<String>,
    since: Instant,
    /// How long the instance stays [`TerminationPhase::Listed`]; `None`: until told otherwise.
    listed_for: Option<Duration>,
}

impl Terminated {
    fn phase(&self, now: Instant) -> TerminationPhase {
        match self.listed_for {
            Some(listed_for) if now.saturating_duration_since(self.since) >= listed_for => {
                TerminationPhase::Gone
            }
            _ => TerminationPhase::Listed,
        }
    }
}

/// The instances the proxy shows as terminated.
#[derive(Debug, Default)]
pub(crate) struct Terminations {
    instances: BTreeMap<String, Terminated>,
}

/// The instance state EC2 reports for a terminated instance.
const TERMINATED_STATE: &str =
    "<instanceState><code>48</code><name>terminated</name></instanceState>";

impl Terminations {
    /// Marks `instance` terminated now, its `enis` deleted.
    pub(crate) fn terminate(
        &mut self,
        instance: &str,
        enis: &[&str],
        listed_for: Option<Duration>,
        now: Instant,
    ) {
        self.instances.insert(
            instance.to_owned(),
            Terminated {
                enis: enis.iter().map(|e| (*e).to_owned()).collect(),
                since: now,
                listed_for,
            },
        );
    }

    /// Moves `instance` to [`TerminationPhase::Gone`] at `now`; false if it is not terminated.
    pub(crate) fn forget(&mut self, instance: &str, now: Instant) -> bool {
        match self.instances.get_mut(instance) {
            Some(terminated) => {
                terminated.since = now;
                terminated.listed_for = Some(Duration::ZERO);
                true
            }
            None => false,
        }
    }

    /// The phase of `instance` at `now`, if it is terminated.
    pub(crate) fn phase(&self, instance: &str, now: Instant) -> Option<TerminationPhase> {
        self.instances.get(instance).map(|t| t.phase(now))
    }

    fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    fn gone(&self, instance: &str, now: Instant) -> bool {
        self.phase(instance, now) == Some(TerminationPhase::Gone)
    }

    fn deleted_eni(&self, eni: &str) -> bool {
        self.instances
            .values()
            .any(|t| t.enis.iter().any(|e| e == eni))
    }

    /// The error EC2 would answer to a request with these form parameters, if any: a request
    /// naming a deleted ENI or a forgotten instance fails as a whole, as EC2's does.
    pub(crate) fn refusal<'a>(
        &self,
        params: impl Iterator<Item = (&'a str, &'a str)>,
        now: Instant,
    ) -> Option<Refusal> {
        if self.is_empty() {
            return None;
        }
        for (key, value) in params {
            if is_list_key(key, "NetworkInterfaceId") && self.deleted_eni(value) {
                return Some(Refusal {
                    code: "InvalidNetworkInterfaceID.NotFound",
                    message: format!("The networkInterface ID '{value}' does not exist"),
                });
            }
            if is_list_key(key, "InstanceId") && self.gone(value, now) {
                return Some(Refusal {
                    code: "InvalidInstanceID.NotFound",
                    message: format!("The instance ID '{value}' does not exist"),
                });
            }
        }
        None
    }

    /// `answer` (an EC2 XML answer) as EC2 would give it: deleted ENIs left out of every
    /// `networkInterfaceSet`, forgotten instances (and reservations left empty) out of every
    /// listing, listed ones shown `terminated`. `None` when nothing changes or the text is not
    /// XML the proxy can read (it is then forwarded untouched).
    pub(crate) fn rewrite(&self, answer: &str, now: Instant) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let edits = self.edits(answer, now)?;
        if edits.is_empty() {
            return None;
        }
        let mut out = answer.to_owned();
        for (range, replacement) in edits.into_iter().rev() {
            out.replace_range(range, replacement);
        }
        Some(out)
    }

    /// The edits to `answer`, in document order, none inside another.
    fn edits(&self, answer: &str, now: Instant) -> Option<Vec<(Range<usize>, &'static str)>> {
        let mut stack: Vec<Frame<'_>> = Vec::new();
        let mut edits = Edits::default();
        for token in Tokenizer::from(answer) {
            match token.ok()? {
                Token::ElementStart { local, span, .. } => {
                    let kind = match (local.as_str(), stack.last().map(|f| f.name)) {
                        ("item", Some("reservationSet")) => Kind::Reservation,
                        ("item", Some("instancesSet")) => Kind::Instance,
                        ("item", Some("networkInterfaceSet")) => Kind::Interface,
                        _ => Kind::Other,
                    };
                    stack.push(Frame::new(local.as_str(), span.start(), kind));
                }
                Token::ElementEnd {
                    end: ElementEnd::Open,
                    ..
                } => {}
                Token::ElementEnd { span, .. } => {
                    let frame = stack.pop()?;
                    let range = frame.start..span.end();
                    self.close(frame, range, &mut stack, &mut edits, now);
                }
                Token::Text { text } => {
                    if let [.., item, leaf] = stack.as_mut_slice() {
                        let id_element = match item.kind {
                            Kind::Instance => "instanceId",
                            Kind::Interface => "networkInterfaceId",
                            Kind::Reservation | Kind::Other => "",
                        };
                        if leaf.name == id_element {
                            item.id = Some(text.as_str().trim());
                        }
                    }
                }
                _ => {}
            }
        }
        Some(edits.0)
    }

    /// Decides what happens to the element `frame` that spans `range`, now that it is complete.
    fn close<'a>(
        &self,
        frame: Frame<'a>,
        range: Range<usize>,
        stack: &mut [Frame<'a>],
        edits: &mut Edits,
        now: Instant,
    ) {
        if frame.name == "instanceState"
            && let Some(item) = stack.last_mut()
            && item.kind == Kind::Instance
        {
            item.state = Some(range.clone());
        }
        match frame.kind {
            Kind::Instance => {
                // The reservation `item` sits two levels up, above `instancesSet`.
                let reservation = stack.iter_mut().rev().find(|f| f.kind == Kind::Reservation);
                if let Some(reservation) = reservation {
                    reservation.instances += 1;
                }
                let Some(id) = frame.id else { return };
                match self.phase(id, now) {
                    Some(TerminationPhase::Gone) => {
                        edits.push(range, "");
                        if let Some(reservation) =
                            stack.iter_mut().rev().find(|f| f.kind == Kind::Reservation)
                        {
                            reservation.removed += 1;
                        }
                    }
                    Some(TerminationPhase::Listed) => {
                        if let Some(state) = frame.state {
                            edits.push(state, TERMINATED_STATE);
                        }
                    }
                    None => {}
                }
            }
            Kind::Interface => {
                if frame.id.is_some_and(|eni| self.deleted_eni(eni)) {
                    edits.push(range, "");
                }
            }
            Kind::Reservation => {
                if frame.instances > 0 && frame.removed == frame.instances {
                    edits.push(range, "");
                }
            }
            Kind::Other => {}
        }
    }
}

/// What an element is to the rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Reservation,
    Instance,
    Interface,
    Other,
}

/// An element being read.
#[derive(Debug)]
struct Frame<'a> {
    name: &'a str,
    start: usize,
    kind: Kind,
    /// The `instanceId` or `networkInterfaceId` of an instance or interface item.
    id: Option<&'a str>,
    /// An instance item's `instanceState` element.
    state: Option<Range<usize>>,
    /// A reservation's instances, and how many of them are left out.
    instances: usize,
    removed: usize,
}

impl<'a> Frame<'a> {
    fn new(name: &'a str, start: usize, kind: Kind) -> Self {
        Self {
            name,
            start,
            kind,
            id: None,
            state: None,
            instances: 0,
            removed: 0,
        }
    }
}

/// Replacements of byte ranges; an element's replacement supersedes those inside it.
#[derive(Debug, Default)]
struct Edits(Vec<(Range<usize>, &'static str)>);

impl Edits {
    fn push(&mut self, range: Range<usize>, replacement: &'static str) {
        // Elements close inner first, so the edits inside `range` are already here.
        self.0
            .retain(|(r, _)| r.end <= range.start || r.start >= range.end);
        self.0.push((range, replacement));
        self.0.sort_by_key(|(r, _)| r.start);
    }
}

/// Whether `key` is `name` or a list member of it (`name.1`, `name.2`, …).
fn is_list_key(key: &str, name: &str) -> bool {
    key.strip_prefix(name).is_some_and(|rest| {
        rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of moto's DescribeInstances answer: two reservations, one instance with two
    /// interfaces, the other alone.
    const INSTANCES: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
        <DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
        <requestId>r</requestId><reservationSet>\
        <item><reservationId>r-1</reservationId><instancesSet><item>\
        <instanceId>i-dead</instanceId>\
        <instanceState><code>16</code><name>running</name></instanceState>\
        <networkInterfaceSet>\
        <item><networkInterfaceId>eni-dead</networkInterfaceId>\
        <attachment><deviceIndex>0</deviceIndex></attachment>\
        <privateIpAddressesSet><item><privateIpAddress>10.0.0.5</privateIpAddress></item>\
        </privateIpAddressesSet></item>\
        <item><networkInterfaceId>eni-kept</networkInterfaceId>\
        <attachment><deviceIndex>1</deviceIndex></attachment></item>\
        </networkInterfaceSet></item></instancesSet></item>\
        <item><reservationId>r-2</reservationId><instancesSet><item>\
        <instanceId>i-live</instanceId>\
        <instanceState><code>16</code><name>running</name></instanceState>\
        <networkInterfaceSet><item><networkInterfaceId>eni-live</networkInterfaceId></item>\
        </networkInterfaceSet></item></instancesSet></item>\
        </reservationSet></DescribeInstancesResponse>";

    fn terminated(listed_for: Option<Duration>) -> (Terminations, Instant) {
        let now = Instant::now();
        let mut t = Terminations::default();
        t.terminate("i-dead", &["eni-dead"], listed_for, now);
        (t, now)
    }

    #[test]
    fn a_listed_instance_shows_terminated_without_its_deleted_interface() {
        let (t, now) = terminated(None);
        let out = t.rewrite(INSTANCES, now).unwrap();
        assert!(!out.contains("eni-dead"), "{out}");
        assert!(!out.contains("10.0.0.5"), "{out}");
        assert!(
            out.contains("eni-kept"),
            "an interface not deleted stays: {out}"
        );
        assert!(out.contains("eni-live") && out.contains("i-live"), "{out}");
        assert!(out.contains("<instanceId>i-dead</instanceId>"), "{out}");
        assert_eq!(out.matches("<name>terminated</name>").count(), 1, "{out}");
        assert_eq!(out.matches("<name>running</name>").count(), 1, "{out}");
        assert!(Tokenizer::from(out.as_str()).all(|t| t.is_ok()), "{out}");
    }

    #[test]
    fn a_forgotten_instance_and_its_emptied_reservation_leave_listings() {
        let (t, now) = terminated(Some(Duration::from_secs(60)));
        assert_eq!(t.phase("i-dead", now), Some(TerminationPhase::Listed));
        let later = now + Duration::from_secs(60);
        assert_eq!(t.phase("i-dead", later), Some(TerminationPhase::Gone));
        let out = t.rewrite(INSTANCES, later).unwrap();
        assert!(!out.contains("i-dead") && !out.contains("r-1"), "{out}");
        assert!(out.contains("<reservationId>r-2</reservationId>"), "{out}");
        assert!(out.contains("i-live") && out.contains("eni-live"), "{out}");
        assert!(Tokenizer::from(out.as_str()).all(|t| t.is_ok()), "{out}");
    }

    #[test]
    fn forget_moves_an_instance_to_gone_at_once() {
        let (mut t, now) = terminated(None);
        assert_eq!(t.phase("i-dead", now), Some(TerminationPhase::Listed));
        assert!(t.forget("i-dead", now));
        assert_eq!(t.phase("i-dead", now), Some(TerminationPhase::Gone));
        assert!(!t.forget("i-other", now));
        assert_eq!(t.phase("i-other", now), None);
    }

    #[test]
    fn requests_naming_a_deleted_interface_or_a_forgotten_instance_are_refused() {
        let (mut t, now) = terminated(None);
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: [Case<'_>; 6] = [
            (
                &[
                    ("Action", "UnassignPrivateIpAddresses"),
                    ("NetworkInterfaceId", "eni-dead"),
                ],
                Some("InvalidNetworkInterfaceID.NotFound"),
            ),
            (
                &[
                    ("NetworkInterfaceId.1", "eni-live"),
                    ("NetworkInterfaceId.2", "eni-dead"),
                ],
                Some("InvalidNetworkInterfaceID.NotFound"),
            ),
            (&[("NetworkInterfaceId.1", "eni-live")], None),
            (&[("InstanceId.1", "i-dead")], None),
            (&[("NetworkInterfaceIdX", "eni-dead")], None),
            (&[("InstanceId", "i-live")], None),
        ];
        for (params, code) in cases {
            let refusal = t.refusal(params.iter().copied(), now);
            assert_eq!(refusal.map(|r| r.code), code, "{params:?}");
        }
        t.forget("i-dead", now);
        let refusal = t
            .refusal([("InstanceId.1", "i-dead")].into_iter(), now)
            .unwrap();
        assert_eq!(refusal.code, "InvalidInstanceID.NotFound");
        assert_eq!(refusal.message, "The instance ID 'i-dead' does not exist");
    }

    #[test]
    fn answers_without_terminated_instances_or_not_xml_pass_untouched() {
        let (t, now) = terminated(None);
        let other = INSTANCES
            .replace("i-dead", "i-other")
            .replace("eni-dead", "eni-other");
        assert_eq!(t.rewrite(&other, now), None);
        assert_eq!(t.rewrite("not <xml", now), None);
        assert_eq!(Terminations::default().rewrite(INSTANCES, now), None);
    }

    #[test]
    fn list_keys_are_the_name_or_its_numbered_members() {
        assert!(is_list_key("InstanceId", "InstanceId"));
        assert!(is_list_key("InstanceId.12", "InstanceId"));
        assert!(!is_list_key("InstanceId.", "InstanceId"));
        assert!(!is_list_key("InstanceIds", "InstanceId"));
        assert!(!is_list_key("InstanceId.1.x", "InstanceId"));
    }
}
