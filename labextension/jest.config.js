/** Unit tests of the panel's model and formatting (ts-jest, jsdom). */
module.exports = {
  testEnvironment: 'jsdom',
  roots: ['<rootDir>/test'],
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  },
  moduleNameMapper: {
    '\\.css$': '<rootDir>/test/style-stub.js'
  }
};
