//! Every tag value in one table. A tag is 8 bits, as Open MPI's: users own
//! `0..=`[`MAX_USER_TAG`]; the transports use the rest for their own
//! protocols. The same value may mean different things on different
//! transports (each transport reads only its own), but no internal tag is
//! ever delivered to a user handler.

/// Largest tag available to users (of the job API and of every transport).
pub const MAX_USER_TAG: u8 = 239;

/// Whether `tag` is a user tag.
pub const fn is_user(tag: u8) -> bool {
    tag <= MAX_USER_TAG
}

/// Both transports: a barrier arrival (payload: the epoch, u64 LE). Over
/// TCP this is the barrier frame the bare-metal node speaks too.
pub const BARRIER: u8 = 253;
/// Both transports: a chunk of a message larger than one fragment / frame
/// (each transport has its own chunk header).
pub const CHUNK: u8 = 254;

/// Shared memory: a single-copy rendezvous (the receiver reads the
/// sender's memory).
pub const SM_RNDV: u8 = 255;
/// Shared memory: a get request.
pub const SM_GET_REQ: u8 = 252;
/// Shared memory: the answer (status) to a get or put.
pub const SM_RMA_REPLY: u8 = 251;
/// Shared memory: a put's data, in fragments.
pub const SM_PUT_DATA: u8 = 250;
/// Shared memory: a get's data, in fragments.
pub const SM_GET_DATA: u8 = 249;
/// Shared memory: a put by single copy (the target reads the source).
pub const SM_PUT_CMA: u8 = 248;
/// Shared memory: a split single-copy rendezvous (the receiver reads the
/// first part, the sender writes the rest into the receiver's landing
/// buffer).
pub const SM_RNDV_SPLIT: u8 = 247;
/// Shared memory: a receiver's landing buffer for split rendezvous, made
/// known to the sender.
pub const SM_LANDING: u8 = 246;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_tags_are_distinct_and_outside_the_user_range() {
        let internal = [
            BARRIER,
            CHUNK,
            SM_RNDV,
            SM_GET_REQ,
            SM_RMA_REPLY,
            SM_PUT_DATA,
            SM_GET_DATA,
            SM_PUT_CMA,
            SM_RNDV_SPLIT,
            SM_LANDING,
        ];
        for (i, a) in internal.iter().enumerate() {
            assert!(!is_user(*a));
            for b in &internal[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
