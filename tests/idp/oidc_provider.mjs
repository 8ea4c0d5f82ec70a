// The OpenID Connect provider that gpulab's tests sign in through: npm's oidc-provider 9
// (ESM only), on 127.0.0.1, with one confidential client and a login form that checks
// passwords. Adapted from ../shared/reference/identity-harness/oidc_provider.mjs.
// Accounts live in a JSON file that is read again at every lookup, so that a test can
// remove a member or change her groups "in the directory" while the provider runs:
//   {"alice": {"password": "...", "groups": ["gpu-users", "gpu-admins"], "email": "..."}}
// Env: OIDC_HOST (default 127.0.0.1), OIDC_PORT, OIDC_ACCOUNTS (the JSON file), OIDC_CLIENT_ID, OIDC_CLIENT_SECRET,
//   OIDC_REDIRECT_URIS (comma list; they match exactly); optional OIDC_ACCESS_TTL (seconds an
//   access token lasts; the library's default: an hour) and OIDC_REFRESH_TOKENS=1 (a sign-in
//   also gets a refresh token, as Keycloak and most lab providers give).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const env = (k) => {
  if (!process.env[k]) { console.error(`oidc_provider.mjs: ${k} is not set`); process.exit(2); }
  return process.env[k];
};
const PORT = Number(env('OIDC_PORT'));
const HOST = process.env.OIDC_HOST || '127.0.0.1';
const ISSUER = `http://${HOST}:${PORT}`;
const req = createRequire(`${dirname(fileURLToPath(import.meta.url))}/`);
const { Provider } = await import(pathToFileURL(req.resolve('oidc-provider')).href);

const accounts = () => JSON.parse(readFileSync(env('OIDC_ACCOUNTS'), 'utf8'));
const SCOPE_CLAIMS = {
  openid: ['sub'], profile: ['name', 'preferred_username'],
  email: ['email', 'email_verified'], groups: ['groups'],
};

const REFRESH_TOKENS = process.env.OIDC_REFRESH_TOKENS === '1';
const ACCESS_TTL = Number(process.env.OIDC_ACCESS_TTL || 3600);

const provider = new Provider(ISSUER, {
  clients: [{
    client_id: env('OIDC_CLIENT_ID'),
    client_secret: env('OIDC_CLIENT_SECRET'),
    redirect_uris: env('OIDC_REDIRECT_URIS').split(','),
    grant_types: REFRESH_TOKENS ? ['authorization_code', 'refresh_token'] : ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_post',
  }],
  claims: SCOPE_CLAIMS,
  scopes: ['openid', 'profile', 'email', 'groups'],
  cookies: { keys: ['gpulab-tests-only-cookie-key'] },
  ttl: { AccessToken: ACCESS_TTL },
  clockTolerance: 0,  // its default takes tokens 15 s past their expiry; one clock here
  // without offline_access in the request: a refresh token whenever the client may use one
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  features: { devInteractions: { enabled: false } },
  async findAccount(ctx, sub) {
    const a = accounts()[sub];   // removed from the file: tokens issued to it stop working
    if (!a) return undefined;
    return {
      accountId: sub,
      async claims() {
        return { sub, preferred_username: a.username ?? sub, name: sub,
          email: a.email ?? `${sub}@lab.example`, email_verified: true, groups: a.groups ?? [] };
      },
    };
  },
  // A first-party client: every scope is granted without a consent page.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope(Object.keys(SCOPE_CLAIMS).join(' '));
    grant.addOIDCClaims(Object.values(SCOPE_CLAIMS).flat());
    await grant.save();
    return grant;
  },
});
for (const ev of ['server_error', 'grant.error', 'authorization.error', 'userinfo.error']) {
  provider.on(ev, (ctx, err) => console.error(`${ev}: ${err.name} ${err.message} ${err.error_description ?? ''}`));
}

// what the tests count: each token the provider hands out, by grant (a refresh among them)
provider.on('grant.success', (ctx) => console.log(`grant.success ${ctx.oidc.params.grant_type}`));

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const loginForm = (uid, error = '') => `<!DOCTYPE html><html><head><meta charset="utf-8">
<title>Lab directory: sign in</title></head><body><h1>Lab directory</h1>
${error && `<p id="error">${esc(error)}</p>`}
<form id="login-form" method="post" action="/interaction/${uid}" autocomplete="off">
<input type="hidden" name="prompt" value="login"/>
<input id="login" name="login" type="text" placeholder="username" required autofocus/>
<input id="password" name="password" type="password" placeholder="password" required/>
<button id="submit" type="submit">Sign in</button></form></body></html>`;

async function formBody(ctx) {
  let raw = '';
  for await (const chunk of ctx.req) raw += chunk;
  return new URLSearchParams(raw);
}

// The login form, before the provider's own routes; it checks the password.
provider.use(async (ctx, next) => {
  const m = ctx.path.match(/^\/interaction\/([^/]+)$/);
  if (!m) return next();
  ctx.set('cache-control', 'no-store');
  let details;
  try {
    details = await provider.interactionDetails(ctx.req, ctx.res);
  } catch (err) {
    ctx.status = 400; ctx.body = `interaction error: ${err.message}`; return undefined;
  }
  const { uid, prompt } = details;
  if (ctx.method === 'GET') {
    ctx.type = 'html'; ctx.body = loginForm(uid); return undefined;
  }
  if (ctx.method !== 'POST' || prompt.name !== 'login') {
    ctx.status = 400; ctx.body = 'unexpected prompt'; return undefined;
  }
  const form = await formBody(ctx);
  const account = accounts()[form.get('login')];
  if (!account || account.password !== form.get('password')) {
    ctx.status = 401; ctx.type = 'html';
    ctx.body = loginForm(uid, 'Invalid username or password'); return undefined;
  }
  await provider.interactionFinished(ctx.req, ctx.res,
    { login: { accountId: form.get('login') } }, { mergeWithLastSubmission: false });
  ctx.respond = false;  // interactionFinished wrote the 303
  return undefined;
});

provider.listen(PORT, HOST, () => {
  console.log(`oidc-provider listening on ${ISSUER}`);
});
