//! The wire-up key/value service's protocol (`btl_core::wireup::kv`)
//! against arbitrary bytes, from both sides:
//! - `split_frame`, `parse_request` and `parse_response` give a value or a
//!   typed error, never a panic; whatever parses is re-encoded into a frame
//!   that parses to the same thing;
//! - a `Client` driven by an input-chosen sequence of requests and of
//!   response bodies never panics, never accepts an answer that does not
//!   answer what it asked, and stays failed once failed.
#![no_main]

use arbitrary::Arbitrary;
use btl_core::wireup::kv::{
    encode_request, encode_response, parse_request, parse_response, split_frame, Client,
    KvError, Pending, Request, Response, MAX_FRAME,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Step<'a> {
    Hello(&'a str),
    Put(&'a str, &'a [u8]),
    Fence,
    Get(u32, &'a str),
    Who,
    GetAll(u32, &'a str),
    /// A response body from the service.
    Answer(&'a [u8]),
}

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    raw: &'a [u8],
    rank: u32,
    size: u32,
    steps: Vec<Step<'a>>,
}

fn answers(p: Pending, r: &Response<'_>) -> bool {
    matches!(
        (p, r),
        (_, Response::Refused { .. })
            | (Pending::Hello, Response::Welcome)
            | (Pending::Put, Response::Stored)
            | (Pending::Fence, Response::FenceDone)
            | (Pending::Get, Response::Value(_))
            | (Pending::Who, Response::Waiting(_))
            | (Pending::GetAll(_), Response::Values(_))
            | (Pending::WhoInFence, Response::Waiting(_) | Response::FenceDone)
    )
}

fuzz_target!(|input: Input<'_>| {
    let mut buf = vec![0u8; MAX_FRAME];
    // Frames and bodies, both directions.
    if let Ok(Some((body, used))) = split_frame(input.raw) {
        assert_eq!(used, body.len() + 4);
        assert!(!body.is_empty());
    }
    if let Ok(req) = parse_request(input.raw) {
        let n = encode_request(&req, &mut buf).unwrap();
        let (body, _) = split_frame(&buf[..n]).unwrap().unwrap();
        assert_eq!(parse_request(body).unwrap(), req);
        if let Request::Hello { rank, size, .. } = req {
            assert!(rank < size);
        }
    }
    if let Ok(resp) = parse_response(input.raw) {
        let n = encode_response(&resp, &mut buf).unwrap();
        let (body, _) = split_frame(&buf[..n]).unwrap().unwrap();
        assert_eq!(parse_response(body).unwrap(), resp);
    }

    // The client state machine.
    let Ok(mut c) = Client::new(input.rank, input.size) else {
        assert!(input.rank >= input.size);
        return;
    };
    for step in input.steps.iter().take(64) {
        let before = c.pending();
        let r = match step {
            Step::Hello(job) => c.hello(job, &mut buf).map(drop),
            Step::Put(k, v) => c.put(k, v, &mut buf).map(drop),
            Step::Fence => c.fence(&mut buf).map(drop),
            Step::Get(rank, k) => c.get(*rank, k, &mut buf).map(drop),
            Step::Who => c.who(&mut buf).map(drop),
            Step::GetAll(first, k) => c.get_all(*first, k, &mut buf).map(drop),
            Step::Answer(body) => match c.on_response(body) {
                Ok(resp) => {
                    assert!(answers(before, &resp), "{before:?} accepted {resp:?}");
                    if let (Pending::GetAll(first), Response::Values(v)) = (before, &resp) {
                        // From where it asked, at least one, within the job;
                        // every entry readable.
                        assert_eq!(v.first(), first);
                        assert!(v.count() >= 1);
                        assert!(u64::from(first) + u64::from(v.count()) <= u64::from(input.size));
                        assert_eq!(v.iter().count(), v.count() as usize);
                    }
                    Ok(())
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    if before != Pending::Failed {
                        assert_eq!(c.pending(), Pending::Failed);
                    }
                    Err(e)
                }
            },
        };
        if before == Pending::Failed {
            assert!(r.is_err() || matches!(step, Step::Who), "{step:?} after failure: {r:?}");
            assert!(matches!(c.pending(), Pending::Failed) || matches!(step, Step::Who));
        }
        if let Err(KvError::Busy) = r {
            // A refused request changes nothing.
            assert_eq!(c.pending(), before);
        }
    }
});
