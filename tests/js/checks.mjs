// The runner the client scripts share: each check in order, `ok: name`
// or `FAILED: name: why` printed; the first failure ends the run (each
// check may build on the ones before it). Then `done()` (closing the
// script's connections), the summary line `<title>: P of N checks
// passed`, and exit status 1 on a failure.

export async function runChecks(title, checks, done) {
  let passed = 0
  let failed = 0
  for (const [name, fn] of checks) {
    try {
      await fn()
      passed++
      console.log(`ok: ${name}`)
    } catch (err) {
      failed = 1
      console.log(`FAILED: ${name}: ${err.message}`)
      break
    }
  }
  done()
  console.log(`${title}: ${passed} of ${checks.length} checks passed`)
  process.exit(failed ? 1 : 0)
}
