import { useCallback, useMemo, useState, type ReactNode } from 'react';
import { useQuery, useQueryClient } from '@tanstack/react-query';
import { api, ApiError, call, getToken, setToken } from '../api/client';
import { keys } from '../api/hooks';
import { AuthContext, type Auth } from './auth';
import { LoadingState } from '../components/States';

async function whoamiWith(token: string) {
  return call(api.GET('/api/v1/whoami', { headers: { Authorization: `Bearer ${token}` } }));
}

export function AuthProvider({ children }: { children: ReactNode }) {
  const qc = useQueryClient();
  const [token, setTok] = useState<string | null>(() => getToken());
  const who = useQuery({
    queryKey: keys.whoami(token),
    enabled: token !== null,
    queryFn: () => whoamiWith(token ?? ''),
    retry: (n, e) => !(e instanceof ApiError && (e.status === 401 || e.status === 403)) && n < 2,
    staleTime: Infinity,
  });

  const signIn = useCallback(
    async (t: string) => {
      const me = await whoamiWith(t); // throws ApiError (401, unreachable…)
      setToken(t);
      qc.setQueryData(keys.whoami(t), me);
      setTok(t);
    },
    [qc],
  );
  const signOut = useCallback(() => {
    setToken(null);
    setTok(null);
    qc.clear();
  }, [qc]);

  // a stored token that the control plane now refuses signs the user out
  const refused = who.error instanceof ApiError && (who.error.status === 401 || who.error.status === 403);
  const value = useMemo<Auth>(() => {
    const whoami = token && !refused ? (who.data ?? null) : null;
    return { token: whoami ? token : null, whoami, canWrite: whoami?.scope === 'admin', signIn, signOut };
  }, [token, refused, who.data, signIn, signOut]);

  if (token && who.isPending) return <LoadingState label="Checking the token" />;
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}
