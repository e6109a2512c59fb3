/** Unit tests of the panel's model and formatting (ts-jest, jsdom). */
module.exports = {
  testEnvironment: 'jsdom',
  roots: ['<rootDir>/test'],
  setupFiles: ['<rootDir>/test/setup.js'],
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  },
  moduleNameMapper: {
    '\\.css$': '<rootDir>/test/style-stub.js'
  }
};
