import { useState, type FormEvent } from 'react';
import { Navigate, useLocation, useNavigate } from 'react-router';
import { useAuth } from '../auth/auth';
import { errorText } from '../components/States';

export function SignIn() {
  const { token, signIn } = useAuth();
  const nav = useNavigate();
  const loc = useLocation();
  const next = (loc.state as { from?: string } | null)?.from ?? '/';
  const [value, setValue] = useState('');
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  if (token) return <Navigate to={next} replace />;

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (!value.trim()) {
      setError('Enter a token.');
      return;
    }
    setBusy(true);
    setError(null);
    try {
      await signIn(value.trim());
      nav(next, { replace: true });
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main className="signin" id="main">
      <form className="card" onSubmit={submit} noValidate>
        <h1>HyCache</h1>
        <p className="muted">Sign in with an API token (admin or read-only). It is kept for this browser tab only.</p>
        <div className="field">
          <label htmlFor="token">API token</label>
          <input id="token" type="password" autoComplete="off" value={value} onChange={(e) => setValue(e.target.value)} aria-invalid={!!error} aria-describedby={error ? 'token-err' : undefined} />
        </div>
        {error && (
          <p id="token-err" role="alert" className="error-text">
            {error}
          </p>
        )}
        <button type="submit" className="primary" disabled={busy}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </main>
  );
}
