// Cross-checks this project's NIP-OA and NIP-98 signatures with an
// independent implementation (nostr-tools, on @noble/curves), and makes
// vectors there for the Rust side to check. Writes vectors.json.
//
//   cargo run -p protocol --example make_vectors
//   cd protocol/tests/vectors && npm install --no-save nostr-tools@2 && node cross_check.mjs
import { readFileSync, writeFileSync } from 'node:fs'
import { schnorr } from '@noble/curves/secp256k1.js'
import { sha256 } from '@noble/hashes/sha2.js'
import { bytesToHex, hexToBytes, utf8ToBytes } from '@noble/hashes/utils.js'
import { finalizeEvent, getPublicKey, verifyEvent } from 'nostr-tools/pure'

const here = new URL('.', import.meta.url)
const rustMade = JSON.parse(readFileSync(new URL('rust_made.json', here)))
const toolsVersion = JSON.parse(readFileSync(new URL('node_modules/nostr-tools/package.json', here))).version

const digest = (agent, conditions) => sha256(utf8ToBytes(`nostr:agent-auth:${agent}:${conditions}`))
const oaValid = (v) => {
  try {
    return v.owner !== v.agent && schnorr.verify(hexToBytes(v.sig), digest(v.agent, v.conditions), hexToBytes(v.owner))
  } catch {
    return false
  }
}
const tag = (ev, name) => (ev.tags.find((t) => t[0] === name) || [])[1]
const nip98Valid = (v) => {
  if (!verifyEvent(v.event) || v.event.kind !== 27235) return false
  if (tag(v.event, 'u') !== v.url || tag(v.event, 'method') !== v.method) return false
  const payload = tag(v.event, 'payload')
  if (v.body.length > 0) return payload === bytesToHex(sha256(utf8ToBytes(v.body)))
  return payload === undefined || payload === bytesToHex(sha256(new Uint8Array()))
}

// Checked here: every Rust-made vector must verify.
const rust = {
  nip_oa: rustMade.nip_oa.map((v) => ({ ...v, verified_by_nostr_tools: oaValid(v) })),
  nip98: rustMade.nip98.map((v) => ({ ...v, verified_by_nostr_tools: nip98Valid(v) })),
}

// Made here, with expected validity, for the Rust side to check.
const sk = (b) => new Uint8Array(32).fill(b)
const owner = sk(3), agent = sk(4), other = sk(5)
const ownerPk = getPublicKey(owner), agentPk = getPublicKey(agent), otherPk = getPublicKey(other)
const signOa = (secret, agentHex, conditions) => bytesToHex(schnorr.sign(digest(agentHex, conditions), secret))
const oa = []
for (const conditions of ['', 'kind=1', 'kind=9&created_at<1900000000']) {
  oa.push({ agent: agentPk, owner: ownerPk, conditions, sig: signOa(owner, agentPk, conditions), valid: true })
}
const good = oa[1]
oa.push({ ...good, conditions: 'kind=2', valid: false, why: 'conditions changed after signing' })
oa.push({ ...good, agent: otherPk, valid: false, why: 'signature is for another agent' })
oa.push({ ...good, owner: otherPk, valid: false, why: 'another owner' })
oa.push({ agent: agentPk, owner: agentPk, conditions: '', sig: signOa(agent, agentPk, ''), valid: false, why: 'self-owned' })
oa.push({ agent: agentPk, owner: ownerPk, conditions: 'kind=abc', sig: signOa(owner, agentPk, 'kind=abc'), valid: false, why: 'malformed conditions' })

const nip98 = []
const body = '{"outcome":"delivered"}'
const url = 'https://relay.example.com/deliveries/42/finish'
const ev98 = (tags) => finalizeEvent({ kind: 27235, created_at: 1800000000, tags, content: '' }, agent)
const payload = bytesToHex(sha256(utf8ToBytes(body)))
nip98.push({ event: ev98([['u', url], ['method', 'POST'], ['payload', payload]]), method: 'POST', url, body, valid: true })
nip98.push({ event: ev98([['u', url], ['method', 'POST'], ['payload', payload]]), method: 'POST', url, body: '{"outcome":"failed"}', valid: false, why: 'payload_mismatch' })
nip98.push({ event: ev98([['u', url], ['method', 'GET']]), method: 'POST', url, body: '', valid: false, why: 'method_mismatch' })
nip98.push({ event: ev98([['u', 'https://evil.example.com/deliveries/42/finish'], ['method', 'POST'], ['payload', payload]]), method: 'POST', url, body, valid: false, why: 'url_mismatch' })
const tampered = ev98([['u', url], ['method', 'POST'], ['payload', payload]])
nip98.push({ event: { ...tampered, content: 'x' }, method: 'POST', url, body, valid: false, why: 'bad_signature' })

const out = { generated_by: `nostr-tools ${toolsVersion} (@noble/curves)`, rust_made: rust, node_made: { nip_oa: oa, nip98 } }
writeFileSync(new URL('vectors.json', here), JSON.stringify(out, null, 2) + '\n')
const bad = [...rust.nip_oa, ...rust.nip98].filter((v) => !v.verified_by_nostr_tools)
console.log(`rust-made vectors verified by nostr-tools: ${rust.nip_oa.length + rust.nip98.length - bad.length}/${rust.nip_oa.length + rust.nip98.length}`)
process.exit(bad.length === 0 ? 0 : 1)
