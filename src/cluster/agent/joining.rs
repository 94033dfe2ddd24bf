//! Joining and leaving: join codes, joining another cluster with one (SPAKE2, then the secret handed
//! over inside an authenticated channel), answering the joins of others, and leaving.

use super::*;

impl Shared {
    /// Makes a join code, valid for 10 minutes (replacing any previous one).
    pub fn create_code(&self) -> JoinCode {
        let code = JoinCode::generate();
        self.state.locked().code = Some(code.clone());
        self.emit(ClusterEvent::CodeCreated { expires_at_ms: code.expires_at_ms });
        code
    }

    /// Joins the cluster behind `target`, leaving the current one.
    pub async fn join(self: &Arc<Self>, target: JoinTarget) -> anyhow::Result<()> {
        let candidates = match &target.address {
            Some(address) => vec![resolve(address, self.config.control_port()).await?],
            None => self.find_pairing_nodes().await?,
        };
        let mut last_error = None;
        for addr in candidates {
            match request_patiently(addr, &target.code, self.my_record()).await {
                Ok((secret, members)) => {
                    let mut membership = Membership { secret, members: BTreeMap::new() };
                    for m in members {
                        membership.members.insert(m.id, m);
                    }
                    membership.upsert(self.my_record());
                    self.replace_membership(membership);
                    tracing::info!("joined cluster {} through {addr}", self.cluster_id());
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!("join through {addr} failed: {e}");
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.map_or_else(
            || anyhow::anyhow!("no shoal node of another cluster was found nearby (mDNS); use --join CODE@HOST:PORT"),
            |e| anyhow::anyhow!(e),
        ))
    }

    /// Nodes of other clusters nearby (mDNS); those without an active code refuse at once.
    async fn find_pairing_nodes(self: &Arc<Self>) -> anyhow::Result<Vec<SocketAddr>> {
        if self.discovery.locked().is_none() {
            anyhow::bail!("mDNS is off or unavailable, so nearby clusters cannot be found; use --join CODE@HOST:PORT");
        }
        let deadline = Instant::now() + Duration::from_secs(6);
        loop {
            let found: Vec<SocketAddr> = {
                let state = self.state.locked();
                state.nearby.values().flat_map(|n| n.control.first().copied()).collect()
            };
            if !found.is_empty() || Instant::now() >= deadline {
                return Ok(found);
            }
            if self.discovery.locked().is_some() && !BROWSING.load(Ordering::Relaxed) {
                start_browsing(self);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Leaves the cluster: tells the members, then starts a new one-node cluster with a fresh secret.
    pub async fn leave(&self) {
        self.broadcast(ControlMessage::Leaving);
        // Let the writers flush the goodbye before the connections close.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.static_peers.stop();
        self.replace_membership(Membership::new_cluster(self.my_record()));
    }

    /// Switches to `membership`: closes every connection and forgets every peer of the old cluster.
    fn replace_membership(&self, membership: Membership) {
        let cluster_id = membership.cluster_id();
        {
            let mut state = self.state.locked();
            state.membership = membership;
            state.peers.clear();
            state.static_routes.clear();
            state.code = None;
            let discovered = std::mem::take(&mut state.discovered);
            state.nearby.extend(discovered);
            let nearby = std::mem::take(&mut state.nearby);
            for (id, node) in nearby {
                if node.cluster_id == cluster_id {
                    state.discovered.insert(id, node);
                } else {
                    state.nearby.insert(id, node);
                }
            }
        }
        self.departed.locked().clear();
        self.links.clear();
        self.epoch.send_modify(|e| *e += 1);
        self.save();
        self.readvertise();
        self.emit(ClusterEvent::ClusterChanged { cluster_id });
    }
}

/// Waits between join attempts a member refused for their rate (a flood of attempts from others may
/// be using it up): about a minute and a half in all before giving up.
const RATE_LIMITED_WAITS: [Duration; 5] = [
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(20),
    Duration::from_secs(40),
];

/// [`join::request`], tried again after each wait of [`RATE_LIMITED_WAITS`] while the member refuses
/// for the rate of attempts.
async fn request_patiently(
    addr: SocketAddr,
    code: &str,
    me: MemberRecord,
) -> Result<(crate::cluster::ClusterSecret, Vec<MemberRecord>), join::JoinError> {
    for wait in RATE_LIMITED_WAITS {
        match join::request(addr, code, me.clone()).await {
            Err(join::JoinError::RateLimited) => {
                tracing::warn!(
                    "{addr} refused the join for the rate of attempts it gets (others may be flooding it); trying again in {} s",
                    wait.as_secs()
                );
                tokio::time::sleep(wait).await;
            }
            done => return done,
        }
    }
    join::request(addr, code, me).await
}

pub(super) async fn resolve(address: &str, default_port: u16) -> anyhow::Result<SocketAddr> {
    let with_port = if address.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        address.to_string()
    } else {
        format!("{address}:{default_port}")
    };
    let mut addresses =
        tokio::net::lookup_host(&with_port).await.map_err(|e| anyhow::anyhow!("cannot resolve {with_port}: {e}"))?;
    let first = addresses.next();
    first.ok_or_else(|| anyhow::anyhow!("{with_port} has no address"))
}

pub(super) async fn serve_join(shared: Agent, stream: TcpStream, from: SocketAddr) -> Result<(), NetError> {
    let allowed = shared.limiter.locked().allow(from.ip());
    let decide = || {
        if !allowed {
            return Err(Refusal::RateLimited);
        }
        let state = shared.state.locked();
        match &state.code {
            None => Err(Refusal::NoCode),
            Some(c) if c.is_expired() => Err(Refusal::Expired),
            Some(c) if c.is_blocked(from.ip()) => Err(Refusal::TooManyWrong),
            Some(c) => Ok(c.normalized().to_string()),
        }
    };
    let attempt = |accepted: bool, reason: &str| ClusterEvent::JoinAttempt {
        from: from.to_string(),
        accepted,
        reason: reason.into(),
    };
    match join::accept(stream, decide).await {
        Ok((_reader, writer, mut node)) => {
            if let Err(why) = node.check() {
                shared.emit(attempt(false, &why));
                return Err(NetError::BadPreamble(why));
            }
            if node.control.is_empty() || node.control.iter().all(|a| a.ip().is_unspecified()) {
                node.control = vec![SocketAddr::new(from.ip(), shared.config.control_port())];
            }
            let (secret, members) = {
                let state = shared.state.locked();
                (state.membership.secret.clone(), state.membership.members.values().cloned().collect::<Vec<_>>())
            };
            join::welcome(writer, secret, members).await?;
            shared.emit(attempt(true, &format!("{} joined", node.name)));
            shared.admit(node);
            Ok(())
        }
        Err(AcceptError::WrongCode) => {
            let revoked_after = {
                let mut state = shared.state.locked();
                let revoked = state.code.as_mut().is_some_and(|c| c.record_failure(from.ip()));
                let addresses = state.code.as_ref().map_or(0, JoinCode::failing_addresses);
                if revoked {
                    state.code = None;
                }
                revoked.then_some(addresses)
            };
            shared.emit(attempt(false, "wrong code"));
            if let Some(addresses) = revoked_after {
                shared.emit(ClusterEvent::CodeRevoked {
                    reason: format!(
                        "{} wrong attempts from {addresses} addresses: someone may be guessing it. Make a new code \
                         with `shoal code` when the node that should join is ready",
                        pairing::MAX_FAILURES
                    ),
                });
            }
            Err(NetError::Handshake)
        }
        Err(AcceptError::Refused(r)) => {
            shared.emit(attempt(false, r.explain()));
            Ok(())
        }
        Err(AcceptError::Broken(reason)) => {
            shared.emit(attempt(false, &reason));
            Err(NetError::BadPreamble(reason))
        }
    }
}
