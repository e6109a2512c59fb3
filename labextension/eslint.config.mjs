// eslint for the side panel's TypeScript (prettier owns the formatting).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', 'ui-tests/node_modules/', '**/*.js', '**/*.mjs'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      eqeqeq: 'error',
      curly: 'error',
      'prefer-arrow-callback': 'error'
    }
  }
);
