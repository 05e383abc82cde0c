import { createContext, useContext } from 'react';
import type { WhoAmI } from '../api/types';

export interface Auth {
  token: string | null;
  whoami: WhoAmI | null;
  /** true when the token may change things (admin scope) */
  canWrite: boolean;
  signIn: (token: string) => Promise<void>;
  signOut: () => void;
}

export const AuthContext = createContext<Auth | null>(null);

export function useAuth(): Auth {
  const a = useContext(AuthContext);
  if (!a) throw new Error('useAuth outside AuthProvider');
  return a;
}
