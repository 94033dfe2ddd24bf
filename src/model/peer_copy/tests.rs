//! Copies from peers that send what they should not: a piece damaged on the way (the sender's hash says
//! so), a whole file that is not the hub's, more bytes than were asked for, and a file rewritten on the
//! sender's disk while it was sent. Each is refused with the reason and leaves nothing behind. The peers
//! are real authenticated connections on loopback; the last one is shoal's own `serve`.

use super::*;
use crate::node::DataDir;

const SECRET: Psk = [9; 32];

/// A file's worth of bytes that differ from offset to offset.
fn content(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

fn offered(bytes: &[u8], sha256: Option<String>) -> OfferedFile {
    OfferedFile { name: "m.gguf".into(), size: bytes.len() as u64, repo: None, sha256, layers: None, present: None }
}

fn json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

/// A peer that answers one fetch with `frames` (its header, data frames and trailer, as given).
async fn rogue_peer(frames: Vec<Vec<u8>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let preamble = secure::read_preamble(&mut stream).await.unwrap();
        let (mut reader, mut writer) = secure::respond(stream, preamble, &SECRET).await.unwrap();
        let _request = reader.read_frame(MAX_MESSAGE).await.unwrap();
        for frame in frames {
            if writer.write_frame(&frame).await.is_err() {
                return;
            }
        }
    });
    addr
}

/// What a faithful peer sends for the whole of `bytes`, with `tamper` applied to the data frames.
fn answer(file: &OfferedFile, bytes: &[u8], tamper: impl Fn(usize, &mut Vec<u8>)) -> Vec<Vec<u8>> {
    let mut frames = vec![json(&Header { error: None, file: Some(file.clone()) })];
    for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
        let mut chunk = chunk.to_vec();
        tamper(i, &mut chunk);
        frames.push(chunk);
    }
    frames.push(json(&Trailer { sha256: hex::encode(Sha256::digest(bytes)), error: None }));
    frames
}

/// Fetches `file` (whole, or `ranges`) from `addr` into a fresh folder; the result and whether anything
/// (the file or its `.part`) was left there.
async fn fetch_into_temp(
    addr: SocketAddr,
    file: &OfferedFile,
    ranges: &[(u64, u64)],
) -> (Result<CopyReport, CopyError>, bool) {
    let folder = tempfile::tempdir().unwrap();
    let dest = folder.path().join("m.gguf");
    let result = fetch(addr, &SECRET, file, ranges, &dest, |_| {}).await;
    let left = std::fs::read_dir(folder.path()).unwrap().count() > 0;
    (result, left)
}

#[tokio::test]
async fn a_piece_damaged_on_the_way_is_refused_and_nothing_is_kept() {
    let bytes = content(3 * CHUNK + 100);
    let file = offered(&bytes, None);
    let damaged = answer(&file, &bytes, |i, chunk| {
        if i == 1 {
            chunk[4242] ^= 0x10;
        }
    });
    let (result, left) = fetch_into_temp(rogue_peer(damaged).await, &file, &[]).await;
    let error = result.unwrap_err();
    assert!(matches!(error, CopyError::Damaged(_)) && error.to_string().contains("the sender hashed"), "{error}");
    assert!(!left, "a damaged copy left a file behind");

    // The same answer undamaged is kept, with its hash.
    let (result, left) = fetch_into_temp(rogue_peer(answer(&file, &bytes, |_, _| {})).await, &file, &[]).await;
    assert_eq!(result.unwrap().sha256, hex::encode(Sha256::digest(&bytes)));
    assert!(left);
}

#[tokio::test]
async fn a_whole_file_that_is_not_the_hubs_is_refused() {
    let bytes = content(CHUNK + 5);
    let file = offered(&bytes, Some("00".repeat(32)));
    let (result, left) = fetch_into_temp(rogue_peer(answer(&file, &bytes, |_, _| {})).await, &file, &[]).await;
    let error = result.unwrap_err();
    assert!(error.to_string().contains("the hub's SHA-256 is 0000"), "{error}");
    assert!(!left);
    // A range cannot be checked against the hub's hash of the whole file: the sender's hash must do.
    let range = &bytes[10..1010];
    let mut frames = vec![json(&Header { error: None, file: Some(file.clone()) })];
    frames.push(range.to_vec());
    frames.push(json(&Trailer { sha256: hex::encode(Sha256::digest(range)), error: None }));
    let (result, _) = fetch_into_temp(rogue_peer(frames).await, &file, &[(10, 1000)]).await;
    assert_eq!(result.unwrap().bytes, 1000);
}

#[tokio::test]
async fn a_peer_that_sends_more_than_it_owes_is_refused() {
    let bytes = content(10);
    let file = offered(&bytes, None);
    let frames = vec![json(&Header { error: None, file: Some(file.clone()) }), content(4096)];
    let (result, left) = fetch_into_temp(rogue_peer(frames).await, &file, &[]).await;
    let error = result.unwrap_err();
    assert!(error.to_string().contains("4096 bytes where at most 10 were due"), "{error}");
    assert!(!left);
}

#[tokio::test]
async fn a_file_rewritten_while_it_is_sent_is_refused() {
    // shoal's own `serve`, over a library holding the test model (a file too big to sit in the socket's
    // buffers: the sender is still reading it when the file changes).
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.exists(), "the test model is missing: run scripts/fetch-test-model");
    let root = tempfile::tempdir().unwrap();
    let data_dir = DataDir::new(Some(root.path())).unwrap();
    let library = Library::new(&data_dir);
    std::fs::create_dir_all(library.models_dir()).unwrap();
    let served = library.models_dir().join("m.gguf");
    std::fs::copy(&model, &served).unwrap();
    let size = std::fs::metadata(&served).unwrap().len();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let preamble = secure::read_preamble(&mut stream).await.unwrap();
        let (reader, writer) = secure::respond(stream, preamble, &SECRET).await.unwrap();
        serve(reader, writer, library).await
    });

    let (mut reader, mut writer) = secure::connect(addr, ConnectionKind::ModelCopy, &SECRET).await.unwrap();
    send_json(&mut writer, &Request::Fetch { name: "m.gguf".into(), size, ranges: vec![] }).await.unwrap();
    let header: Header = recv_json(&mut reader).await.unwrap();
    assert_eq!(header.file.map(|f| f.size), Some(size));
    let mut frame = Vec::new();
    reader.read_frame_into(CHUNK, &mut frame).await.unwrap();
    // The first megabyte is here; the rest is not sent yet. The file changes on the sender's disk.
    std::fs::OpenOptions::new().write(true).open(&served).unwrap().write_all_at(b"rewritten", size / 2).unwrap();
    let mut received = frame.len() as u64;
    while received < size {
        reader.read_frame_into(CHUNK, &mut frame).await.unwrap();
        received += frame.len() as u64;
    }
    let trailer: Trailer = recv_json(&mut reader).await.unwrap();
    let error = trailer.error.expect("the sender says the file changed");
    assert!(error.contains("m.gguf changed on the sending node"), "{error}");
    server.await.unwrap().unwrap();

    // And a copy through `fetch` of the file as it is now is whole and kept.
    let served_again = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let library = Library::new(&data_dir);
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let preamble = secure::read_preamble(&mut stream).await.unwrap();
            let (reader, writer) = secure::respond(stream, preamble, &SECRET).await.unwrap();
            serve(reader, writer, library).await
        });
        addr
    };
    let file = OfferedFile { name: "m.gguf".into(), size, repo: None, sha256: None, layers: None, present: None };
    let (result, _) = fetch_into_temp(served_again, &file, &[]).await;
    assert_eq!(result.unwrap().bytes, size);
}
